// The update engines, one of which opt_init sets in o->engine (optim_core.h's opt_engine):
//   device (optim_device.c): AdamW by the backend, the state in backend memory; with
//           optimizer.update_overlap the update of each bucket beside the next forward;
//   offload (optim_offload.c): optimizer.offload=host, a share of the buckets' state in host
//           memory, updated by the GPU in place (zero-copy) or by the host's cores (offload_update
//           = cpu; with offload_delay during the next step, with offload_layer_wait in the next
//           forward), the other buckets as the device engine's.
// Each sets dev_n (the device share of the state, opt_state_alloc's), and is called after
// opt_layout_build.
#ifndef TRAINER_OPTIM_ENGINE_H
#define TRAINER_OPTIM_ENGINE_H

#include "parallel/step/optim_core.h"

void opt_device_engine_init(opt_state *o);
void opt_offload_engine_init(opt_state *o);

#endif
