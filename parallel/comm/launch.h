// Where each rank runs: its node, its rank on that node (which picks the GPU) and what the
// launcher (Open MPI's mpirun, Slurm's srun, MPICH's hydra) said about it in the environment.
// MPI's own view decides; the launcher's word is the check. A job that MPI did not wire up
// (srun without a PMI plugin starts N one-rank jobs) stops at once with the fix, and a layout
// whose tensor-parallel groups leave a node is named at start-up.
#ifndef TRAINER_LAUNCH_H
#define TRAINER_LAUNCH_H

#include <stddef.h>
#include <stdio.h>

#include "parallel/comm/grid.h"

// What the launcher's environment says about this process; -1 (or "") where it says nothing.
//   mpirun (Open MPI): OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
//   srun (a job step): SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, SLURM_NODEID,
//                      SLURM_STEP_NUM_NODES, SLURMD_NODENAME (a batch script's own environment
//                      has no SLURM_STEP_NUM_TASKS: it is not a launch)
//   hydra (MPICH):     PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS
// The first launcher found in that order wins: mpirun run inside a Slurm allocation passes the
// allocation's SLURM_* variables on to every rank, its own OMPI_* ones are the truth.
typedef struct launch_env {
  char launcher[16];            // "mpirun", "srun", "hydra", or "" (none: a plain process)
  int rank, size;               // world rank and number of processes it started
  int local_rank, local_size;   // on this node
  int node, n_nodes;            // node index and count
  char node_name[64];           // as the launcher names the node
} launch_env;

// The variable's value or NULL; launch_env_read takes it so tests can pass a table.
typedef const char *(*launch_getenv_fn)(const char *name, void *ctx);
// Fills e from get (NULL: the process environment).
void launch_env_read(launch_env *e, launch_getenv_fn get, void *ctx);

// 0 when the launcher started as many processes as MPI_COMM_WORLD holds (or no launcher is
// known); else -1 and a message with the fix (srun --mpi=pmix, an MPI library that matches
// the launcher).
int launch_check_size(const launch_env *e, int mpi_size, char *err, size_t n_err);

// This rank's place as MPI sees it. Nodes are the groups of MPI_Comm_split_type(
// MPI_COMM_TYPE_SHARED), numbered in the order of their lowest world rank.
typedef struct launch_place {
  int rank, size;
  int node, n_nodes;
  int local_rank, local_size;   // within the node; the GPU is local_rank % GPUs visible
  char host[256];               // MPI_Get_processor_name
} launch_place;

// Collective over MPI_COMM_WORLD.
void launch_place_init(launch_place *p);

// Collective over MPI_COMM_WORLD: gathers every rank's place, launcher view, grid coordinates
// and device (e.g. "cpu", "cuda:3") on world rank 0, which writes to out:
//   layout: 16 ranks on 2 nodes (8 per node), launcher mpirun; every tp group within one node
// then, with per_rank, one line per rank in rank order (docs/multinode.md):
//   layout rank=9 node=1 host=gpu-b local_rank=1 local_size=8 tp=1 dp=0 pp=1 device=cuda:1
//          launcher=mpirun launcher_rank=9 launcher_local_rank=1 launcher_node=-
// (one line; launcher_node is the launcher's node index or name, - where it gives none) and a
// warning line for a tp group that spans nodes and for each rank where the launcher's rank or
// local rank differs from MPI's. Returns the number of warnings (on every rank).
int launch_report(const launch_place *p, const launch_env *e, const grid *g, const char *device, int per_rank,
                  FILE *out);

#endif
