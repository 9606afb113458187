/* mg-devinfo: prints the CUDA device(s) and exits 0 when one is usable;
 * prints "no CUDA device: <reason>" and exits 1 otherwise. Tests use the
 * exit status to decide whether GPU suites run or skip. Uses cudart only:
 * without a driver the runtime reports an error, never a crash. */
#include <stdio.h>
#include <string.h>
#include <cuda_runtime_api.h>

static void version_str(int v, char *buf, size_t n)
{
    if (v <= 0)
        snprintf(buf, n, "unknown");
    else
        snprintf(buf, n, "%d.%d", v / 1000, (v % 1000) / 10);
}

int main(int argc, char **argv)
{
    int quiet = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-q") == 0 || strcmp(argv[i], "--quiet") == 0) {
            quiet = 1;
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            printf("usage: %s [-q]\n"
                   "Prints the CUDA devices; exit 0 if one is usable, 1 if not.\n"
                   "  -q, --quiet  print nothing, only set the exit status\n",
                   argv[0]);
            return 0;
        } else {
            fprintf(stderr, "%s: unknown option '%s' (try --help)\n", argv[0], argv[i]);
            return 2;
        }
    }

    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n <= 0) {
        if (!quiet)
            printf("no CUDA device: %s\n",
                   e != cudaSuccess ? cudaGetErrorString(e) : "no devices found");
        return 1;
    }

    int drv = 0, rt = 0;
    (void)cudaDriverGetVersion(&drv);
    (void)cudaRuntimeGetVersion(&rt);
    char dbuf[32], rbuf[32];
    version_str(drv, dbuf, sizeof dbuf);
    version_str(rt, rbuf, sizeof rbuf);

    int usable = 0;
    for (int d = 0; d < n; d++) {
        struct cudaDeviceProp p;
        memset(&p, 0, sizeof p);
        e = cudaGetDeviceProperties(&p, d);
        if (e != cudaSuccess) {
            if (!quiet)
                printf("device %d: cannot query: %s\n", d, cudaGetErrorString(e));
            continue;
        }
        /* Usable means a context can be created on it (not prohibited,
         * not lost). */
        size_t free_b = 0, total_b = 0;
        int ok = cudaSetDevice(d) == cudaSuccess && cudaFree(0) == cudaSuccess;
        if (ok && cudaMemGetInfo(&free_b, &total_b) != cudaSuccess)
            free_b = 0;
        if (!ok)
            (void)cudaGetLastError();
        usable += ok;
        if (!quiet) {
            printf("device %d: %s\n", d, p.name);
            printf("  compute capability: %d.%d (sm_%d%d)\n", p.major, p.minor,
                   p.major, p.minor);
            printf("  SMs: %d\n", p.multiProcessorCount);
            printf("  memory: %.1f GiB total", (double)p.totalGlobalMem / 1073741824.0);
            if (ok)
                printf(", %.1f GiB free", (double)free_b / 1073741824.0);
            printf("\n  shared memory per block (opt-in): %zu bytes\n",
                   (size_t)p.sharedMemPerBlockOptin);
            printf("  usable: %s\n", ok ? "yes" : "no (context creation failed)");
        }
    }
    if (!quiet)
        printf("driver: %s, runtime: %s\n", dbuf, rbuf);
    if (!usable) {
        if (!quiet)
            printf("no CUDA device: %d device(s) found, none usable\n", n);
        return 1;
    }
    return 0;
}
