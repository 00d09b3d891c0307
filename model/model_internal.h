// Shared between model.c (layout) and block.c (compute): the scratch buffers. Not part of the model's public interface.
#ifndef TRAINER_MODEL_INTERNAL_H
#define TRAINER_MODEL_INTERNAL_H

#include "model/model.h"

void model_work_init(model *m);
void model_work_free(model *m);

#endif
