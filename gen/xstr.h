/* xstr.h: malloc'd printf, the one string-formatting helper of the
 * generator and the tuner (messages, paths, JSON). */
#ifndef MG_XSTR_H
#define MG_XSTR_H
#include <stdarg.h>

/* A malloc'd, formatted string; NULL only when out of memory. */
char *xstr_printf(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
char *xstr_vprintf(const char *fmt, va_list ap);

#endif
