/* mg_handle.h: the registry of live API handles (models, trainers, graphs)
 * of every generated library in the process. A library registers a handle
 * when it creates it and removes it when it destroys it; every call checks
 * the handle it is given against the registry before reading it, so a
 * destroyed, forged or foreign handle is an error (MG_ERR_INVALID_ARG with
 * a message), never a read of freed memory. Thread-safe (one mutex). */
#ifndef MG_HANDLE_H
#define MG_HANDLE_H

#ifdef __cplusplus
extern "C" {
#endif

#include "mg_status.h"

/* kind: the address of a static object of the library that names the kind
 * of handle (so two libraries, or a model and a trainer, never match).
 * Returns MG_ERR_OUT_OF_MEMORY (with a message) when the registry cannot
 * grow. */
mg_status mg_handle_add(const void *h, const void *kind);
/* Removes h (a no-op if it is not registered). */
void mg_handle_remove(const void *h);
/* 1 if h is registered with kind. */
int mg_handle_live(const void *h, const void *kind);
/* Handles registered now (tests). */
unsigned long mg_handle_count(void);

#ifdef __cplusplus
}
#endif
#endif
