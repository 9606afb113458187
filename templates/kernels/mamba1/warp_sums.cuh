// warp_sums.cuh: the reduce-scatter that sums several values over a warp's
// lanes, for the Mamba-1 kernels that sum a group of values at once (the
// forward scans' y of a group of steps, the fused conv + x_proj's sums of a
// tile's tokens, the scan backward's dB | dC), and the level counts they are
// sized with. Shared by NAME_kernels.cu, NAME_backward.cu and the scan's
// tune candidates (which inline it before scan_body.cuh); #included inside
// the anonymous namespace, so it includes nothing itself (FULL_MASK comes
// from the includer).

// floor(log2 x) (0 for x <= 1), and the number of trailing zero bits of x (0 for x = 0)
__host__ __device__ constexpr int m1_ilog2(int x) { return x <= 1 ? 0 : 1 + m1_ilog2(x / 2); }
__host__ __device__ constexpr int m1_ctz(int x) { return (x & 1) || x == 0 ? 0 : 1 + m1_ctz(x / 2); }

// The first LEVELS levels of a butterfly over the lanes (offsets o0,
// o0 / 2, ..), as a reduce-scatter
// of the V values v: at level l a lane keeps half of its values (the upper
// half where its lane bit o is set), sends the other half to its partner
// and adds what it receives, so that after them v[0 .. V >> LEVELS) hold the
// sums of values [start, start + (V >> LEVELS)) over the lanes that differ
// in those bits. Returns start. Every sum adds the same pairs in the same
// order as a butterfly per value (a + b and b + a are the same bits), with
// V - 1 shuffles at the halving levels where that takes V each. The caller
// runs the levels left as a butterfly on the values it still holds.
// SHORT: the offsets may reach 0 before LEVELS (a channel of fewer lanes
// than values: the forward scans' y below 4 lanes), and such a level does
// nothing; its test is left out of the callers that cannot get there (a
// test the compiler keeps changes their code). lane_bits keeps the caller's
// type (int, or threadIdx.x's unsigned).
template <int LEVELS, bool SHORT = false, int V, typename Bits>
__device__ __forceinline__ int rs_halve(float (&v)[V], Bits lane_bits, int o0)
{
    int start = 0;
#pragma unroll
    for (int l = 0; l < LEVELS; ++l) {
        const int o = o0 >> l, h = V >> (l + 1);
        if (!SHORT || o > 0) {   // constant where the caller's shape is
            const bool up = (lane_bits & o) != 0;
#pragma unroll
            for (int k = 0; k < V / 2; ++k) if (k < h) {   // constant bounds: v stays in registers
                const float send = up ? v[k] : v[k + h];
                const float keep = up ? v[k + h] : v[k];
                v[k] = keep + __shfl_xor_sync(FULL_MASK, send, o);
            }
            if (up) start += h;
        }
    }
    return start;
}
