// The fake cuRAND of cuda-emu (libcurand.so.10): pseudo-random generators whose numbers come
// from the host's std::mt19937_64 (not cuRAND's sequences: tests must not depend on them),
// issued on the generator's stream through the fake driver.
#include <cuda.h>
#include <curand.h>

#include <functional>
#include <random>

extern "C" int cuda_emu_issue(CUstream stream, std::function<void()> *operation);

namespace {

struct Generator {
    std::mt19937_64 engine{0};
    CUstream stream = nullptr;
};

Generator &of(curandGenerator_t generator) { return *reinterpret_cast<Generator *>(generator); }

template <typename Fill> curandStatus_t issue(curandGenerator_t generator, Fill fill) {
    Generator *g = &of(generator);
    std::function<void()> operation = [g, fill] { fill(g->engine); };
    if (cuda_emu_issue(g->stream, &operation) != 0) return CURAND_STATUS_LAUNCH_FAILURE;
    return CURAND_STATUS_SUCCESS;
}

}  // namespace

extern "C" {

curandStatus_t curandCreateGenerator(curandGenerator_t *generator, curandRngType_t) {
    *generator = reinterpret_cast<curandGenerator_t>(new Generator());
    return CURAND_STATUS_SUCCESS;
}

curandStatus_t curandDestroyGenerator(curandGenerator_t generator) {
    delete reinterpret_cast<Generator *>(generator);
    return CURAND_STATUS_SUCCESS;
}

curandStatus_t curandSetPseudoRandomGeneratorSeed(curandGenerator_t generator,
                                                  unsigned long long seed) {
    of(generator).engine.seed(seed);
    return CURAND_STATUS_SUCCESS;
}

curandStatus_t curandSetGeneratorOffset(curandGenerator_t generator, unsigned long long offset) {
    of(generator).engine.discard(offset);
    return CURAND_STATUS_SUCCESS;
}

curandStatus_t curandSetStream(curandGenerator_t generator, cudaStream_t stream) {
    of(generator).stream = reinterpret_cast<CUstream>(stream);
    return CURAND_STATUS_SUCCESS;
}

curandStatus_t curandGenerateUniform(curandGenerator_t generator, float *out, size_t n) {
    return issue(generator, [out, n](std::mt19937_64 &engine) {
        std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
        for (size_t i = 0; i < n; i++) out[i] = 1.0f - uniform(engine);  // (0, 1]
    });
}

curandStatus_t curandGenerateUniformDouble(curandGenerator_t generator, double *out, size_t n) {
    return issue(generator, [out, n](std::mt19937_64 &engine) {
        std::uniform_real_distribution<double> uniform(0.0, 1.0);
        for (size_t i = 0; i < n; i++) out[i] = 1.0 - uniform(engine);
    });
}

curandStatus_t curandGenerateNormal(curandGenerator_t generator, float *out, size_t n,
                                    float mean, float stddev) {
    return issue(generator, [=](std::mt19937_64 &engine) {
        std::normal_distribution<float> normal(mean, stddev);
        for (size_t i = 0; i < n; i++) out[i] = normal(engine);
    });
}

curandStatus_t curandGenerateNormalDouble(curandGenerator_t generator, double *out, size_t n,
                                          double mean, double stddev) {
    return issue(generator, [=](std::mt19937_64 &engine) {
        std::normal_distribution<double> normal(mean, stddev);
        for (size_t i = 0; i < n; i++) out[i] = normal(engine);
    });
}

}  // extern "C"
