/*
 * llm3d/parallel/grid.h: the rank grid and this rank's groups.
 *
 * defines:
 *   Grid               world = dp x pp x tp ranks and this rank's coordinates
 *   Group              the ranks of one dimension
 *   GRID_MAX_WORLD     the most ranks a Group holds
 *   grid_init          the layout of world ranks and this rank's place in it
 *   grid_check_model   the splits the model must allow (heads, the MLP's 4C
 *                      columns and the padded vocabulary across tp, a layer
 *                      per stage)
 *   grid_rank          the rank at (dp_rank, pp_rank, tp_rank)
 *   grid_groups        this rank's groups: world, dp, tp and pp
 *   grid_split, GRID_DP, GRID_TP, GRID_PP
 *                      the (color, key) that puts this rank in its group of
 *                      one dimension when a communicator is split
 *
 * Header-only (llm.c style): every function is static inline.
 *
 * rank = ((dp_rank * pp) + pp_rank) * tp + tp_rank: tensor-parallel ranks
 * adjacent, then pipeline stages, then data-parallel replicas. A Group lists
 * the ranks of one dimension in coordinate order, so grp->me is this rank's
 * coordinate in it. doc/parallel.md, "Rank grid", works an example.
 */
#ifndef LLM3D_GRID_H
#define LLM3D_GRID_H

#include "llm3d/errors.h"
#include <string.h>

#define GRID_MAX_WORLD 256          // a Group holds at most this many ranks

// ----------------------------------------------------------------------------
// the rank grid

typedef struct { int world, rank, local_rank, dp, tp, pp, dp_rank, tp_rank, pp_rank; } Grid;

typedef struct { int size, me, ranks[GRID_MAX_WORLD]; } Group;  // me = my index in ranks[]

// grid_init: the layout of world = dp x pp x tp ranks and this rank's place in
// it. local_rank starts equal to rank; a launcher's LOCAL_RANK goes in after.
static inline int grid_init(Grid *g, int world, int tp, int pp, int rank, char *err, size_t errlen) {
    memset(g, 0, sizeof(*g));
    if (world < 1 || world > GRID_MAX_WORLD)
        return errorf(err, errlen, "-np %d: the number of ranks must be 1..%d", world, GRID_MAX_WORLD);
    if (tp < 1 || tp > world)
        return errorf(err, errlen, "-tp %d: the tensor-parallel size must be 1..%d (-np)", tp, world);
    if (pp < 1 || pp > world)
        return errorf(err, errlen, "-pp %d: the pipeline size must be 1..%d (-np)", pp, world);
    if (world % (tp * pp) != 0)
        return errorf(err, errlen, "-np %d is not divisible by -tp %d x -pp %d = %d", world, tp, pp, tp * pp);
    if (rank < 0 || rank >= world)
        return errorf(err, errlen, "rank %d is out of range for -np %d", rank, world);
    g->world = world;
    g->rank = rank;
    g->local_rank = rank;
    g->tp = tp;
    g->pp = pp;
    g->dp = world / (tp * pp);
    g->tp_rank = rank % tp;
    g->pp_rank = (rank / tp) % pp;
    g->dp_rank = rank / (tp * pp);
    return 0;
}

// grid_check_model: the splits the model must allow: heads and the MLP's 4C
// columns across tp, the padded vocabulary across tp, a layer per stage
static inline int grid_check_model(const Grid *g, int L, int NH, int C, int Vp, char *err, size_t errlen) {
    if (L < 1 || NH < 1 || C < 1 || Vp < 1)
        return errorf(err, errlen, "model shape L %d, NH %d, C %d, Vp %d: every size must be >= 1", L, NH, C, Vp);
    if (NH % g->tp != 0)
        return errorf(err, errlen, "-tp %d: the model's %d heads (NH) do not split evenly across %d ranks",
                      g->tp, NH, g->tp);
    if ((4 * (long)C) % g->tp != 0)
        return errorf(err, errlen, "-tp %d: the MLP width 4C = %ld does not split evenly across %d ranks",
                      g->tp, 4 * (long)C, g->tp);
    if (Vp % g->tp != 0)
        return errorf(err, errlen, "-tp %d: the padded vocabulary Vp = %d does not split evenly across %d ranks",
                      g->tp, Vp, g->tp);
    if (L < g->pp)
        return errorf(err, errlen, "-pp %d: the model has %d layers (L), fewer than the %d pipeline stages",
                      g->pp, L, g->pp);
    return 0;
}

static inline int grid_rank(const Grid *g, int dp_rank, int pp_rank, int tp_rank) {
    return ((dp_rank * g->pp) + pp_rank) * g->tp + tp_rank;
}

// grid_groups: this rank's groups, members in coordinate order; any may be NULL
static inline void grid_groups(const Grid *g, Group *world, Group *dp, Group *tp, Group *pp) {
    if (world != NULL) {
        world->size = g->world;
        world->me = g->rank;
        for (int r = 0; r < g->world; r++) world->ranks[r] = r;
    }
    if (dp != NULL) {
        dp->size = g->dp;
        dp->me = g->dp_rank;
        for (int d = 0; d < g->dp; d++) dp->ranks[d] = grid_rank(g, d, g->pp_rank, g->tp_rank);
    }
    if (tp != NULL) {
        tp->size = g->tp;
        tp->me = g->tp_rank;
        for (int t = 0; t < g->tp; t++) tp->ranks[t] = grid_rank(g, g->dp_rank, g->pp_rank, t);
    }
    if (pp != NULL) {
        pp->size = g->pp;
        pp->me = g->pp_rank;
        for (int p = 0; p < g->pp; p++) pp->ranks[p] = grid_rank(g, g->dp_rank, p, g->tp_rank);
    }
}

enum { GRID_DP = 0, GRID_TP = 1, GRID_PP = 2 };

// grid_split: the (color, key) that puts this rank in its group of dimension
// dim when a world communicator is split (ncclCommSplit): color numbers the
// group by the rank's other two coordinates, key is its place in the group
// (grp->me), so the split communicator's ranks are the Group's, in order
static inline void grid_split(const Grid *g, int dim, int *color, int *key) {
    if (dim == GRID_DP) {
        *color = g->pp_rank * g->tp + g->tp_rank;
        *key = g->dp_rank;
    } else if (dim == GRID_TP) {
        *color = g->dp_rank * g->pp + g->pp_rank;
        *key = g->tp_rank;
    } else {
        *color = g->dp_rank * g->tp + g->tp_rank;
        *key = g->pp_rank;
    }
}

#endif
