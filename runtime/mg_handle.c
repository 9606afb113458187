/* mg_handle.c: the registry of live API handles (mg_handle.h): a growing
 * array of (handle, kind) pairs under one mutex. A process holds a few
 * handles, so a linear search costs less than the mutex. */
#include "mg_handle.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct {
    const void *h, *kind;
} entry;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static entry *table;
static unsigned long used, cap;

mg_status mg_handle_add(const void *h, const void *kind)
{
    mg_status s = MG_OK;
    pthread_mutex_lock(&lock);
    if (used == cap) {
        const unsigned long ncap = cap ? 2 * cap : 16;
        entry *nt = (entry *)realloc(table, ncap * sizeof *nt);
        if (!nt) s = MG_ERR_OUT_OF_MEMORY;
        else { table = nt; cap = ncap; }
    }
    if (s == MG_OK) {
        table[used].h = h;
        table[used].kind = kind;
        ++used;
    }
    pthread_mutex_unlock(&lock);
    if (s != MG_OK) return mg_fail(s, "handle registry: out of host memory");
    return MG_OK;
}

void mg_handle_remove(const void *h)
{
    pthread_mutex_lock(&lock);
    for (unsigned long i = 0; i < used; ++i)
        if (table[i].h == h) {
            table[i] = table[--used];   /* order does not matter */
            break;
        }
    pthread_mutex_unlock(&lock);
}

int mg_handle_live(const void *h, const void *kind)
{
    int live = 0;
    if (!h) return 0;
    pthread_mutex_lock(&lock);
    for (unsigned long i = 0; i < used && !live; ++i) live = table[i].h == h && table[i].kind == kind;
    pthread_mutex_unlock(&lock);
    return live;
}

unsigned long mg_handle_count(void)
{
    pthread_mutex_lock(&lock);
    const unsigned long n = used;
    pthread_mutex_unlock(&lock);
    return n;
}
