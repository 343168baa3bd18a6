// `wren run --gpus 0,1`: the launcher of a multi-process pipeline (docs/parallel.md). The parent
// process starts one rank per listed GPU (this same binary and command line, with RANK,
// WORLD_SIZE and LOCAL_RANK set as torchrun sets them, and a fresh --nccl-id-file), waits for
// them, and stops the others (by pid) as soon as one fails.
#pragma once
#include <string>
#include <vector>

#include "runtime/engine.h"

namespace wren::cli {

/// True when this process runs under a launcher (RANK and WORLD_SIZE, or Open MPI's variables).
bool under_launcher();

/// Starts gpus.size() ranks of this command and waits: returns 0 when every rank exits 0, else the
/// first failing rank's status (a signal-killed rank gives 128 + signal). Throws wren::Error when
/// a rank cannot be started.
int launch_ranks(const std::vector<int>& gpus);

/// Fills o's rank fields from the launcher's environment (nccl_world_from_env): the device is
/// gpus[rank] when --gpus was given, else LOCAL_RANK. No-op outside a launcher.
void apply_rank_env(EngineOptions& o, const std::vector<int>& gpus);

}  // namespace wren::cli
