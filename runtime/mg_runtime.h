/* mg_runtime.h: the whole mamba-gen runtime (libmgrt) in one include. */
#ifndef MG_RUNTIME_H
#define MG_RUNTIME_H
#include "mg_status.h"
#include "mg_cuda.h"
#include "mg_handle.h"
#include "mg_rng.h"
#include "mg_compare.h"
#include "mg_ref_mamba1.h"
#include "mg_ref_mamba3.h"
#include "mg_ref_seqs.h"
#include "mg_safetensors.h"
#endif
