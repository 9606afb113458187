/* xstr.c: malloc'd printf (see xstr.h). */
#include "xstr.h"

#include <stdio.h>
#include <stdlib.h>

char *xstr_vprintf(const char *fmt, va_list ap)
{
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    char *s = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (s)
        vsnprintf(s, (size_t)n + 1, fmt, ap);
    return s;
}

char *xstr_printf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = xstr_vprintf(fmt, ap);
    va_end(ap);
    return s;
}
