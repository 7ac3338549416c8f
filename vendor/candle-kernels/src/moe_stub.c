// Resident's patch (vendor/README.md): with RESIDENT_CANDLE_MOE=stub, build.rs links this in
// place of the static MoE/GGUF library, so that a build for scripts/cuda-emu (kernels run on
// the CPU) links without 700 s of nvcc. Only a GGUF kept quantised on a GPU (`--dtype
// quantised`) reaches them; each one fails loudly, with its name.
#include <stdio.h>
#include <stdlib.h>

static void skipped(const char *name) {
    fprintf(stderr, "candle's %s is not in this build (RESIDENT_CANDLE_MOE=stub)\n", name);
    abort();
}

void candle_launch_moe_align(void) { skipped("candle_launch_moe_align"); }
void launch_mmq_gguf_q2_k(void) { skipped("launch_mmq_gguf_q2_k"); }
void launch_mmq_gguf_q3_k(void) { skipped("launch_mmq_gguf_q3_k"); }
void launch_mmq_gguf_q4_0(void) { skipped("launch_mmq_gguf_q4_0"); }
void launch_mmq_gguf_q4_1(void) { skipped("launch_mmq_gguf_q4_1"); }
void launch_mmq_gguf_q4_k(void) { skipped("launch_mmq_gguf_q4_k"); }
void launch_mmq_gguf_q5_0(void) { skipped("launch_mmq_gguf_q5_0"); }
void launch_mmq_gguf_q5_1(void) { skipped("launch_mmq_gguf_q5_1"); }
void launch_mmq_gguf_q5_k(void) { skipped("launch_mmq_gguf_q5_k"); }
void launch_mmq_gguf_q6_k(void) { skipped("launch_mmq_gguf_q6_k"); }
void launch_mmq_gguf_q8_0(void) { skipped("launch_mmq_gguf_q8_0"); }
void launch_mmq_quantize_q8_1_D2S6(void) { skipped("launch_mmq_quantize_q8_1_D2S6"); }
void launch_mmq_quantize_q8_1_D4(void) { skipped("launch_mmq_quantize_q8_1_D4"); }
void launch_mmq_quantize_q8_1_DS4(void) { skipped("launch_mmq_quantize_q8_1_DS4"); }
void launch_mmvq_gguf_q2_k_bf16_plain(void) { skipped("launch_mmvq_gguf_q2_k_bf16_plain"); }
void launch_mmvq_gguf_q2_k_f16_plain(void) { skipped("launch_mmvq_gguf_q2_k_f16_plain"); }
void launch_mmvq_gguf_q2_k_f32_plain(void) { skipped("launch_mmvq_gguf_q2_k_f32_plain"); }
void launch_mmvq_gguf_q3_k_bf16_plain(void) { skipped("launch_mmvq_gguf_q3_k_bf16_plain"); }
void launch_mmvq_gguf_q3_k_f16_plain(void) { skipped("launch_mmvq_gguf_q3_k_f16_plain"); }
void launch_mmvq_gguf_q3_k_f32_plain(void) { skipped("launch_mmvq_gguf_q3_k_f32_plain"); }
void launch_mmvq_gguf_q4_0_bf16_plain(void) { skipped("launch_mmvq_gguf_q4_0_bf16_plain"); }
void launch_mmvq_gguf_q4_0_f16_plain(void) { skipped("launch_mmvq_gguf_q4_0_f16_plain"); }
void launch_mmvq_gguf_q4_0_f32_plain(void) { skipped("launch_mmvq_gguf_q4_0_f32_plain"); }
void launch_mmvq_gguf_q4_1_bf16_plain(void) { skipped("launch_mmvq_gguf_q4_1_bf16_plain"); }
void launch_mmvq_gguf_q4_1_f16_plain(void) { skipped("launch_mmvq_gguf_q4_1_f16_plain"); }
void launch_mmvq_gguf_q4_1_f32_plain(void) { skipped("launch_mmvq_gguf_q4_1_f32_plain"); }
void launch_mmvq_gguf_q4_k_bf16_plain(void) { skipped("launch_mmvq_gguf_q4_k_bf16_plain"); }
void launch_mmvq_gguf_q4_k_f16_plain(void) { skipped("launch_mmvq_gguf_q4_k_f16_plain"); }
void launch_mmvq_gguf_q4_k_f32_plain(void) { skipped("launch_mmvq_gguf_q4_k_f32_plain"); }
void launch_mmvq_gguf_q5_0_bf16_plain(void) { skipped("launch_mmvq_gguf_q5_0_bf16_plain"); }
void launch_mmvq_gguf_q5_0_f16_plain(void) { skipped("launch_mmvq_gguf_q5_0_f16_plain"); }
void launch_mmvq_gguf_q5_0_f32_plain(void) { skipped("launch_mmvq_gguf_q5_0_f32_plain"); }
void launch_mmvq_gguf_q5_1_bf16_plain(void) { skipped("launch_mmvq_gguf_q5_1_bf16_plain"); }
void launch_mmvq_gguf_q5_1_f16_plain(void) { skipped("launch_mmvq_gguf_q5_1_f16_plain"); }
void launch_mmvq_gguf_q5_1_f32_plain(void) { skipped("launch_mmvq_gguf_q5_1_f32_plain"); }
void launch_mmvq_gguf_q5_k_bf16_plain(void) { skipped("launch_mmvq_gguf_q5_k_bf16_plain"); }
void launch_mmvq_gguf_q5_k_f16_plain(void) { skipped("launch_mmvq_gguf_q5_k_f16_plain"); }
void launch_mmvq_gguf_q5_k_f32_plain(void) { skipped("launch_mmvq_gguf_q5_k_f32_plain"); }
void launch_mmvq_gguf_q6_k_bf16_plain(void) { skipped("launch_mmvq_gguf_q6_k_bf16_plain"); }
void launch_mmvq_gguf_q6_k_f16_plain(void) { skipped("launch_mmvq_gguf_q6_k_f16_plain"); }
void launch_mmvq_gguf_q6_k_f32_plain(void) { skipped("launch_mmvq_gguf_q6_k_f32_plain"); }
void launch_mmvq_gguf_q8_0_bf16_plain(void) { skipped("launch_mmvq_gguf_q8_0_bf16_plain"); }
void launch_mmvq_gguf_q8_0_f16_plain(void) { skipped("launch_mmvq_gguf_q8_0_f16_plain"); }
void launch_mmvq_gguf_q8_0_f32_plain(void) { skipped("launch_mmvq_gguf_q8_0_f32_plain"); }
void launch_mmvq_gguf_quantize_q8_1_bf16(void) { skipped("launch_mmvq_gguf_quantize_q8_1_bf16"); }
void launch_mmvq_gguf_quantize_q8_1_f16(void) { skipped("launch_mmvq_gguf_quantize_q8_1_f16"); }
void launch_mmvq_gguf_quantize_q8_1_f32(void) { skipped("launch_mmvq_gguf_quantize_q8_1_f32"); }
void moe_gemm_gguf(void) { skipped("moe_gemm_gguf"); }
void moe_gemm_gguf_prefill(void) { skipped("moe_gemm_gguf_prefill"); }
void moe_gemm_wmma(void) { skipped("moe_gemm_wmma"); }
