# A random tiny GPT-2 with a byte-level BPE tokenizer that has chat special
# tokens, and three chat templates of different shapes, written here:
#   make_chat_model.py OUTDIR
# OUTDIR/chatml/   config.json, model.safetensors, tokenizer.json and a
#                  tokenizer_config.json whose chat_template is ChatML-style
#                  (a loop, a default system message on the first turn, the
#                  whitespace rules of block tags), bos <s>, eos </s>
# OUTDIR/llama3/   the same weights and tokenizer; a LLaMA-3-style template
#                  (bos_token and header tokens, `set` in the loop, tojson), bos
#                  <|begin_of_text|>, eos <|eot_id|>
# OUTDIR/alt.jinja a LLaMA-2-style template: the system message folded into
#                  the first user turn (messages[1:]), roles checked with
#                  raise_exception, indented output tags
# OUTDIR/bad.jinja a template with a macro (outside kolos's subset)
import json
import os
import sys
import warnings

warnings.filterwarnings("ignore")
import torch
import tokenizers
import transformers
from tokenizers import decoders, models, pre_tokenizers, trainers

out = sys.argv[1]
SPECIAL = ["<s>", "</s>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>",
           "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]

CHATML = """{%- for message in messages %}
    {%- if loop.first and message.role != 'system' %}
<|im_start|>system
You are kolos.<|im_end|>
    {% endif %}
<|im_start|>{{ message.role }}
{{ message['content'] | trim }}<|im_end|>
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}
"""

LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}"
          "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
          " + message['content'] | trim + '<|eot_id|>' %}"
          "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
          "{% if message.role == 'system' %}{% set content = content + message|tojson %}{% endif %}"
          "{{ content }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
          "{% endif %}")

ALT = """{% if messages[0]['role'] == 'system' %}
    {% set loop_messages = messages[1:] %}
    {% set system_message = messages[0]['content'] %}
{% else %}
    {% set loop_messages = messages %}
    {% set system_message = '' %}
{% endif %}
{% for message in loop_messages %}
    {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {% endif %}
    {% if loop.index0 == 0 and system_message %}
        {% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}
    {% else %}
        {% set content = message['content'] %}
    {% endif %}
    {% if message['role'] == 'user' %}
        {{ bos_token ~ '[INST] ' + content.strip() + ' [/INST]' }}
    {% elif message['role'] == 'assistant' %}
        {{ ' ' + content.strip() + ' ' + eos_token }}
    {% endif %}
{% endfor %}
"""

BAD = "{% macro turn(m) %}{{ m.content }}{% endmacro %}{% for m in messages %}{{ turn(m) }}{% endfor %}"

torch.manual_seed(0)
cfg = transformers.GPT2Config(vocab_size=320, n_positions=96, n_embd=48, n_layer=2, n_head=4,
                              resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)
model = transformers.GPT2LMHeadModel(cfg)
with torch.no_grad():
    for name, p in model.named_parameters():
        if p.dim() == 1:
            p.add_(torch.randn_like(p) * 0.1)
        else:
            p.mul_(4)
chatml = os.path.join(out, "chatml")
model.save_pretrained(chatml)

tok = tokenizers.Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
corpus = ["the quick brown fox jumps over the lazy dog", "kolos serves the model it trained",
          "You are kolos. Be terse. what is kolos?", "hello there, assistant and user"] * 50
tok.train_from_iterator(corpus, trainers.BpeTrainer(
    vocab_size=300, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False))
assert tok.get_vocab_size() <= 320, tok.get_vocab_size()
tok.save(os.path.join(chatml, "tokenizer.json"))


def config(template, bos, eos):
    return {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
            "chat_template": template}


with open(os.path.join(chatml, "tokenizer_config.json"), "w") as f:
    json.dump(config(CHATML, "<s>", "</s>"), f)
llama3 = os.path.join(out, "llama3")
os.makedirs(llama3, exist_ok=True)
for name in ("config.json", "model.safetensors", "tokenizer.json"):
    if not os.path.exists(os.path.join(llama3, name)):
        os.symlink(os.path.abspath(os.path.join(chatml, name)), os.path.join(llama3, name))
with open(os.path.join(llama3, "tokenizer_config.json"), "w") as f:
    json.dump(config(LLAMA3, "<|begin_of_text|>", "<|eot_id|>"), f)
with open(os.path.join(out, "alt.jinja"), "w") as f:
    f.write(ALT)
with open(os.path.join(out, "bad.jinja"), "w") as f:
    f.write(BAD)
print(f"chat model: transformers {transformers.__version__}, tokenizer of {tok.get_vocab_size()} ids")
