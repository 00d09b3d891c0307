// Shared between model.c (layout) and block.c (compute): scratch buffers and the full shape
// of each parameter kind. Not part of the model's public interface.
#ifndef TRAINER_MODEL_INTERNAL_H
#define TRAINER_MODEL_INTERNAL_H

#include "model/model.h"

int model_full_shape(const cfg_model *c, model_kind k, int64_t full[2]);
void model_work_init(model *m);
void model_work_free(model *m);

#endif
