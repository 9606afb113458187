/* gen/templates_embedded.h: the copy of templates/ compiled into mamba-gen.
 * The table itself (gen/templates_embedded.c) is generated at build time by
 * gen/mg-embed from the files listed in TEMPLATE_FILES (Makefile.am), so the
 * binary works without an installed template tree. */
#ifndef MG_TEMPLATES_EMBEDDED_H
#define MG_TEMPLATES_EMBEDDED_H

#include <stddef.h>

typedef struct {
    const char *path;          /* relative to templates/, e.g. "mg/init.lua" */
    const unsigned char *data; /* file bytes, followed by a NUL not counted in size */
    size_t size;
} lh_embedded_file;

/* Sorted by path (strcmp order) so lookups can bisect; lh_embedded_count
 * entries, then one sentinel entry with a NULL path. */
extern const lh_embedded_file lh_embedded_files[];
extern const size_t lh_embedded_count;

#endif
