"""What sac.region's value check (determinism_check="values") costs a
training step of Hugging Face models, beside the default check.

    SAC_DISPATCH=fallback python3 benchmarks/value_check_cost.py [--runs N]

GPT-2 and Llama from small configs (random weights, nothing downloaded), at
two widths; the whole forward, loss included, is one sac.region, fully
recomputed and with torchtitan's op list saved. The two checks alternate step
by step (a machine whose speed drifts slows both alike); each row gives the
median step of each and their ratio. One intra-op thread."""
import argparse
import statistics
import time

import torch
import transformers

import torch_sac as sac

aten = torch.ops.aten
OPS = [aten.mm.default, aten.addmm.default, aten.bmm.default,
       aten._scaled_dot_product_flash_attention_for_cpu.default]


def gpt2(width):
    config = transformers.GPT2Config(n_layer=4, n_embd=width, n_head=4, vocab_size=1024,
                                     n_positions=128, resid_pdrop=0.0, embd_pdrop=0.0,
                                     attn_pdrop=0.0, bos_token_id=1, eos_token_id=2)
    return transformers.GPT2LMHeadModel(config)


def llama(width):
    config = transformers.LlamaConfig(num_hidden_layers=4, hidden_size=width,
                                      intermediate_size=4 * width, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=1024,
                                      max_position_embeddings=128)
    return transformers.LlamaForCausalLM(config)


def step(model, batch, policy, check):
    start = time.perf_counter()
    with sac.region(policy, determinism_check=check):
        loss = model(**batch).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    return (time.perf_counter() - start) * 1000


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    if not sac.mechanism().startswith("fallback"):
        raise SystemExit("sac.region needs SAC_DISPATCH=fallback")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    transformers.logging.set_verbosity_error()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 1024, (4, 128), generator=g)
    batch = {"input_ids": ids, "labels": ids.clone()}
    print(f"{args.runs} steps of each check, alternating, batch 4 x 128, 1 thread\n")
    print("| model | parameters MiB | policy | default ms | values ms | values / default |")
    print("| --- | ---: | --- | ---: | ---: | ---: |")
    for name, make in [("GPT-2", gpt2), ("Llama", llama)]:
        for width in (128, 256):
            model = make(width).train()
            mib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
            for policy_name, policy in [("full recomputation", None), ("torchtitan's ops", OPS)]:
                times = {"default": [], "values": []}
                for check in times:
                    step(model, batch, policy, check)  # warm-up
                for _ in range(args.runs):
                    for check in times:
                        times[check].append(step(model, batch, policy, check))
                plain = statistics.median(times["default"])
                values = statistics.median(times["values"])
                print(f"| {name} 4 x {width} | {mib:.2f} | {policy_name} | {plain:.2f} | "
                      f"{values:.2f} | {values / plain:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
