// warp_sums.cuh: the reduce-scatter that sums several values over a warp's
// lanes, for the kernels that sum a group of values at once (Mamba-1: the
// forward scans' y of a group of steps, the fused conv + x_proj's sums of a
// tile's tokens, the scan backward's dB | dC; Mamba-3: the sequential scan
// backward's column sums), and the level counts they are sized with.
// Emitted as mg_warp_sums.cuh; included by NAME_kernels.cu and
// NAME_backward.cu and inlined into the Mamba-1 scan's tune candidates,
// inside their anonymous namespace, so it includes nothing itself
// (rs_halve's FULL_MASK comes from the includer).

// floor(log2 x) (0 for x <= 1), and the number of trailing zero bits of x (0 for x = 0)
__host__ __device__ constexpr int ws_ilog2(int x) { return x <= 1 ? 0 : 1 + ws_ilog2(x / 2); }
__host__ __device__ constexpr int ws_ctz(int x) { return (x & 1) || x == 0 ? 0 : 1 + ws_ctz(x / 2); }

// The first LEVELS levels of a butterfly over the lanes (offsets o0,
// o0 / 2, ..), as a reduce-scatter of V values, value k being at(k) (a
// float& in the caller's registers: one array, or several read in place):
// at level l a lane keeps half of its values (the upper half where its lane
// bit o is set), sends the other half to its partner and adds what it
// receives, so that after them at(0 .. V >> LEVELS) hold the sums of values
// [start, start + (V >> LEVELS)) over the lanes that differ in those bits.
// Returns start. Every sum adds the same pairs in the same order as a
// butterfly per value (a + b and b + a are the same bits), with V - 1
// shuffles at the halving levels where that takes V each. The caller runs
// the levels left as a butterfly on the values it still holds. mask: the
// shuffles' member mask.
// SHORT: the offsets may reach 0 before LEVELS (a channel of fewer lanes
// than values: the Mamba-1 forward scans' y below 4 lanes), and such a
// level does nothing; its test is left out of the callers that cannot get
// there (a test the compiler keeps changes their code). lane_bits keeps the
// caller's type (int, or threadIdx.x's unsigned).
template <int LEVELS, bool SHORT, int V, class At, typename Bits>
__device__ __forceinline__ int rs_halve_at(At at, Bits lane_bits, int o0, unsigned mask)
{
    int start = 0;
#pragma unroll
    for (int l = 0; l < LEVELS; ++l) {
        const int o = o0 >> l, h = V >> (l + 1);
        if (!SHORT || o > 0) {   // constant where the caller's shape is
            const bool up = (lane_bits & o) != 0;
#pragma unroll
            for (int k = 0; k < V / 2; ++k) if (k < h) {   // constant bounds: the values stay in registers
                float &lo = at(k);
                const float hi = at(k + h);
                const float send = up ? lo : hi;
                const float keep = up ? hi : lo;
                lo = keep + __shfl_xor_sync(mask, send, o);
            }
            if (up) start += h;
        }
    }
    return start;
}

// rs_halve_at over one array v, the whole warp shuffling.
template <int LEVELS, bool SHORT = false, int V, typename Bits>
__device__ __forceinline__ int rs_halve(float (&v)[V], Bits lane_bits, int o0)
{
    return rs_halve_at<LEVELS, SHORT, V>([&](int k) -> float & { return v[k]; }, lane_bits, o0, FULL_MASK);
}
