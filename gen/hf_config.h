/* gen/hf_config.h: `mamba-gen --from-hf CONFIG.json`: a spec from a Hugging
 * Face MambaConfig (hf_). The host reads the file and writes the result;
 * templates/mg/hf.lua parses the JSON, maps the keys and checks the spec. */
#ifndef MG_HF_CONFIG_H
#define MG_HF_CONFIG_H

#include <stddef.h>

#include "lua_host.h"

/* Largest config file read (a config.json is a few KiB). */
#define HF_MAX_BYTES (4u << 20)

/* Converts the config at PATH (NAME: the model name, or NULL: from the
 * config) into spec text (*TEXT, malloc'd, *SIZE bytes). Returns 0; 1 when
 * the file cannot be read or the config is invalid or unsupported, the
 * messages (newline-terminated lines "PATH:LINE:COL: ...") in *ERR; 2 on an
 * internal error, *ERR set. Free *ERR / *TEXT. */
int hf_from_config(lh_host *h, const char *path, const char *name, char **text, size_t *size, char **err);

/* Writes SIZE bytes of DATA to the file PATH: a temporary file next to it,
 * renamed over PATH when complete (readers never see a partial spec).
 * 0, or -1 with *ERR set. */
int hf_write_file(const char *path, const char *data, size_t size, char **err);

#endif
