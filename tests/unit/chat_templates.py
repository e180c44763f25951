"""Small Jinja chat templates modelled on real ones, for the chat unit tests.

- ``CHATML``: SmolLM2-135M-Instruct's template exactly as its GGUF metadata carries it.
- ``HERMES_TOOLS``: ChatML with a tools slot in the system turn (Qwen 2.5 / Hermes style).
- ``GEMMA``: Gemma 3's shape: ``bos_token``, system folded into the first user turn,
  ``model`` role, content ``| trim``.
- ``LLAMA3``: Llama 3.1's shape: header ids, ``<|eot_id|>``, ``ipython`` tool role, tools
  as JSON in the system turn.
- ``QWEN3_THINK``: Qwen3's reasoning rule: an assistant turn before the last user query is
  rendered without its ``<think>...</think>`` — NOT prefix-stable.
"""

from __future__ import annotations

CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CHATML_SPECIALS = ("<|im_start|>", "<|im_end|>")

HERMES_TOOLS = """{%- if tools %}<|im_start|>system
{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}

{% endif %}# Tools

<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>

For each call return <tool_call>{"name": ..., "arguments": {...}}</tool_call><|im_end|>
{% elif messages[0]['role'] == 'system' %}<|im_start|>system
{{ messages[0]['content'] }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if not (loop.first and message['role'] == 'system') %}
{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"""

GEMMA = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}
{%- set loop_messages = messages[1:] -%}
{%- else -%}
{%- set first_user_prefix = "" -%}
{%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
{%- set role = 'model' if message['role'] == 'assistant' else 'user' -%}
{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else "") }}
{{- message['content'] | trim }}<end_of_turn>
{% endfor -%}
{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"""
GEMMA_SPECIALS = ("<start_of_turn>", "<end_of_turn>")

LLAMA3 = """{{- bos_token }}
{%- if messages[0]['role'] == 'system' %}{% set system = messages[0]['content'] %}{% set rest = messages[1:] %}
{%- else %}{% set system = "" %}{% set rest = messages %}{% endif %}
{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' + system }}
{%- if tools %}{{ '\\n\\nTools:\\n' }}{% for t in tools %}{{ t | tojson }}{{ '\\n' }}{% endfor %}{% endif %}
{{- '<|eot_id|>' }}
{%- for message in rest %}
{%- set role = 'ipython' if message['role'] == 'tool' else message['role'] %}
{{- '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"""
LLAMA3_SPECIALS = ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>")

QWEN3_THINK = """{%- set ns = namespace(last_query=-1) %}
{%- for message in messages %}{% if message['role'] == 'user' %}{% set ns.last_query = loop.index0 %}{% endif %}{% endfor %}
{%- for message in messages %}
{%- if message['role'] == 'assistant' %}
{%- set content = message['content'] %}
{%- if '</think>' in content and loop.index0 < ns.last_query %}
{%- set content = content.split('</think>')[-1].lstrip('\\n') %}
{%- endif %}
{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"""
