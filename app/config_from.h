// model.from: hf:DIR (docs/hf.md). The model section is taken from DIR's config.json
// (model/format/hf_config.h); cfg_load calls it once the file and the overrides are read.
#ifndef TRAINER_CONFIG_FROM_H
#define TRAINER_CONFIG_FROM_H

#include <stddef.h>

#include "app/config.h"

// Fills c->model from the directory c->model_from names. set_keys (n_set) are the model keys
// ("dim", ...) the config file or an override set: each must agree with the directory's value,
// except model.seq_len, which may be shorter than its max_position_embeddings (a run trains on a
// context of its choice within the one the model was made for). 0, or -1 with a message naming
// the key and both values.
int cfg_resolve_model_from(cfg *c, const char *const *set_keys, int n_set, char *err, size_t n_err);

#endif
