// pdl.cuh: programmatic dependent launch (PDL, sm_90 and later) for chains
// of short kernels on one stream, such as a decode step's GEMV -> mixer ->
// GEMV. A kernel launched with pdl_launch may start while the kernel before
// it on the stream is still running; it first does only what does not
// depend on that kernel (L2 prefetch hints of its weights, loads of its
// states), then pdl_wait() blocks until the previous kernel has finished and its
// writes are visible, then pdl_release() lets the next kernel of the chain
// start its own prologue. Why: at a few microseconds per kernel, the launch
// gap and each kernel's first memory latency are a large part of a decode
// step; with PDL they overlap the previous kernel's tail.
// Safety: a kernel starts only after every block of the one before has
// passed pdl_wait (it calls pdl_release after it), so when kernel K+1
// starts, kernel K-1 and everything before it have finished. Code before
// pdl_wait may therefore read what kernel K-1 and earlier wrote (the Mamba-3
// decode mixer loads the states the previous step's mixer wrote), but not
// what kernel K writes. That holds only while every kernel of a chain calls
// pdl_release after its pdl_wait. Launched without the attribute (or
// built for a target before sm_90: MG_PDL 0), pdl_wait and pdl_release do
// nothing and the launch is an ordinary one: the same results, bit for bit.
// Needs MG_PDL (NAME_common.cuh). #included inside the anonymous namespace
// of NAME_kernels.cu: it includes nothing itself.

__device__ __forceinline__ void pdl_wait()
{
#if MG_PDL && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_release()
{
#if MG_PDL && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, stream>>>(args...), with the programmatic
// stream serialization attribute where the target has it. Capturable (a
// decode graph records the programmatic edge).
template <typename... KArgs, typename... Args>
cudaError_t pdl_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       Args... args)
{
#if MG_PDL
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
    return e != cudaSuccess ? e : cudaGetLastError();
#else
    kernel<<<grid, block, smem, stream>>>(static_cast<KArgs>(args)...);
    return cudaGetLastError();
#endif
}
