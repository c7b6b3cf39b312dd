"""sac on models this project did not write: Hugging Face transformers
architectures with random weights from small configs (nothing downloaded).
For each, the loss and every gradient under sac's modes are bit-identical to
no checkpointing and to PyTorch's SAC with the same op list."""
import copy
import functools

import pytest
import torch
from torch.utils.checkpoint import create_selective_checkpoint_contexts as torch_contexts

import torch_sac as sac

transformers = pytest.importorskip("transformers")
aten = torch.ops.aten

# Matmuls and attention saved, everything else recomputed: torchtitan's
# choice, written as PyTorch's op list.
OPS = [aten.mm.default, aten.addmm.default, aten.bmm.default,
       aten._scaled_dot_product_flash_attention_for_cpu.default]


def text_batch(vocab, batch=2, length=12, decoder=False):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, vocab, (batch, length), generator=g)
    inputs = {"input_ids": ids, "labels": ids.clone()}
    if decoder:
        inputs["decoder_input_ids"] = torch.randint(3, vocab, (batch, length - 2), generator=g)
        inputs["labels"] = inputs["decoder_input_ids"].clone()
    return inputs


def image_batch(classes, size=32):
    g = torch.Generator().manual_seed(1)
    return {"pixel_values": torch.randn(2, 3, size, size, generator=g),
            "labels": torch.randint(0, classes, (2,), generator=g)}


def gpt2():
    # Dropout on the embeddings and the residual branches. Not on attention's
    # weights: with attn_pdrop > 0, PyTorch's own checkpoint without any
    # policy already gives gradients that differ from no checkpointing on
    # this model (eager and SDPA attention alike; measured).
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=101,
                                     n_positions=32, resid_pdrop=0.1, embd_pdrop=0.1,
                                     attn_pdrop=0.0)
    return transformers.GPT2LMHeadModel(config), text_batch(101)


def llama():
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                      num_attention_heads=4, num_key_value_heads=2,
                                      vocab_size=101, max_position_embeddings=32)
    return transformers.LlamaForCausalLM(config), text_batch(101)


def mixtral():
    config = transformers.MixtralConfig(num_hidden_layers=2, hidden_size=32,
                                        intermediate_size=48, num_attention_heads=4,
                                        num_key_value_heads=2, vocab_size=101,
                                        max_position_embeddings=32, num_local_experts=4,
                                        num_experts_per_tok=2)
    return transformers.MixtralForCausalLM(config), text_batch(101)


def bert():
    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                     num_attention_heads=4, vocab_size=101,
                                     max_position_embeddings=32)
    return transformers.BertForMaskedLM(config), text_batch(101)


def bart():
    config = transformers.BartConfig(encoder_layers=2, decoder_layers=2, d_model=32,
                                     encoder_ffn_dim=64, decoder_ffn_dim=64,
                                     encoder_attention_heads=4, decoder_attention_heads=4,
                                     vocab_size=101, max_position_embeddings=32, dropout=0.1)
    return transformers.BartForConditionalGeneration(config), text_batch(101, decoder=True)


def resnet():
    config = transformers.ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16],
                                       depths=[1, 1], layer_type="basic", num_labels=5)
    return transformers.ResNetForImageClassification(config), image_batch(5)


ARCHITECTURES = [gpt2, llama, mixtral, bert, bart, resnet]


def _checkpoint(*args, **kwargs):
    """torch.utils.checkpoint.checkpoint, looked up as it is called (as
    sac.profile_layers needs to see it)."""
    return torch.utils.checkpoint.checkpoint(*args, **kwargs)


def enable_checkpointing(model, context_fn):
    kwargs = {"use_reentrant": False, "context_fn": context_fn}
    if not model.supports_gradient_checkpointing:
        # Hugging Face's ResNet has no switch: its stages are checkpointed as
        # a user would (timm's checkpoint_seq does the same).
        for stage in model.resnet.encoder.stages:
            stage.forward = functools.partial(_checkpoint, stage.forward, **kwargs)
    elif hasattr(model, "activation_checkpointing_enable"):  # transformers 5's name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def step(model, batch, context_fn):
    model = copy.deepcopy(model)
    model.train()
    if context_fn is not None:
        enable_checkpointing(model, context_fn)
    torch.manual_seed(7)  # dropout draws the same masks in every run
    loss = model(**batch).loss
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def assert_identical(got, expected, what):
    loss, grads = got
    assert torch.equal(loss, expected[0]), f"{what}: loss {loss} != {expected[0]}"
    assert grads.keys() == expected[1].keys(), what
    different = [n for n in grads if not torch.equal(grads[n], expected[1][n])]
    assert not different, f"{what}: gradients differ for {different[:5]}"


@pytest.fixture(scope="module", params=ARCHITECTURES, ids=lambda f: f.__name__)
def model_and_batch(request):
    torch.manual_seed(0)
    model, batch = request.param()
    return model, batch, step(model, batch, None)


def test_op_list_matches_no_checkpointing_and_pytorch(model_and_batch):
    model, batch, expected = model_and_batch
    assert_identical(step(model, batch, sac.context_fn(OPS)), expected, "sac")
    assert_identical(step(model, batch, functools.partial(torch_contexts, OPS)), expected,
                     "PyTorch's SAC")


# (nothing_saveable and compute_intensive_ops run in test_contexts.py.)
@pytest.mark.parametrize("make_policy", [sac.torchtitan_default, sac.everything_saveable],
                         ids=lambda f: f.__name__)
def test_presets_match_no_checkpointing(model_and_batch, make_policy):
    model, batch, expected = model_and_batch
    assert_identical(step(model, batch, sac.context_fn(make_policy())), expected,
                     make_policy.__name__)
