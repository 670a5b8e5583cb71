// deepspeed.cpp's public API in one include: config → initialize → backward/step.
#pragma once

#include "dscpp/checkpoint/consolidate.h"
#include "dscpp/checkpoint/hf_gpt2.h"
#include "dscpp/comm/comm.h"
#include "dscpp/comm/topology.h"
#include "dscpp/config/config.h"
#include "dscpp/engine/device.h"
#include "dscpp/engine/engine.h"
#include "dscpp/engine/partitioned_init.h"
#include "dscpp/moe/expert_groups.h"
#include "dscpp/moe/gate.h"
#include "dscpp/moe/moe_layer.h"
#include "dscpp/parallel/tensor_parallel_layers.h"
#include "dscpp/parallel/tensor_parallel_ops.h"
#include "dscpp/pipe/partition.h"
#include "dscpp/pipe/pipeline_engine.h"
#include "dscpp/pipe/schedule.h"
