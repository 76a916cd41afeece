// DITTO_HD marks the functions both backends run: __host__ __device__ under nvcc, nothing in a
// host compiler. Includes nothing, so every header of core/numerics/ may include it.
#pragma once

#ifndef DITTO_HD
#if defined(__CUDACC__)
#define DITTO_HD __host__ __device__
#else
#define DITTO_HD
#endif
#endif
