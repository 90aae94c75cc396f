#!/usr/bin/env python3
"""Expected chat prompts for pinch's chat-template tests, from llama.cpp itself.

Two oracles, one per kind of template (tests/tests/chat_templates.rs compares byte for byte):

* Named templates (llama.cpp's `llm_chat_apply_template`): rendered by
  `llama_cpp.llama_chat_apply_template` (llama-cpp-python 0.3.36 = llama.cpp 0c1e570), once
  per built-in name and once per Jinja text (llama.cpp detects the format from the text;
  `null` when it detects none).
* Jinja templates: rendered by jinja2 in the environment of llama-cpp-python's
  `Jinja2ChatFormatter` (trim_blocks, lstrip_blocks, loopcontrols, `{% generation %}`
  ignored, its `tojson`) with the variables it passes, except `strftime_now` (a clock would
  make the output change by the day; pinch has none). `{"error": ...}` when jinja2 fails
  or the template raises.

Usage:
  PYTHONPATH=/root/.cache/pinch/llama-cpp-python python3 tools/gen_chat_templates.py \
      [--copy SDIST_LLAMA_CPP]   # also (re)copy the Jinja files and inline test cases
Writes tests/data/templates/expected.json.
"""
import ctypes, json, os, re, shutil, sys

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "data", "templates")
SDIST = "/root/.cache/pinch/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp"

# The model templates tested: file in llama.cpp's models/templates -> (bos, eos) texts
# (the model's own where it matters to the families pinch targets, else `<s>`/`</s>`).
# `*.gguf.jinja` are `tokenizer.chat_template` of GGUF files (see the README there).
JINJA_FILES = {
    "Apertus-8B-Instruct.jinja": ("<s>", "</s>"),
    "Apriel-1.6-15b-Thinker-fixed.jinja": ("<s>", "</s>"),
    "Cohere2MoE.jinja": ("<s>", "</s>"),
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja": ("<s>", "</s>"),
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": ("<s>", "</s>"),
    "GLM-4.6.jinja": ("<s>", "</s>"),
    "GLM-4.7-Flash.jinja": ("<s>", "</s>"),
    "GigaChat3-10B-A1.8B.jinja": ("<s>", "</s>"),
    "GigaChat3.1-10B-A1.8B.jinja": ("<s>", "</s>"),
    "Kimi-K2-Instruct.jinja": ("<s>", "</s>"),
    "Kimi-K2-Thinking.jinja": ("<s>", "</s>"),
    "Kimi-K3.jinja": ("<s>", "</s>"),
    "LFM2.5-8B-A1B.jinja": ("<s>", "</s>"),
    "MiMo-VL.jinja": ("<s>", "</s>"),
    "MiniMax-M1.jinja": ("<s>", "</s>"),
    "MiniMax-M2.jinja": ("<s>", "</s>"),
    "MiniMax-M3.jinja": ("<s>", "</s>"),
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": ("<s>", "</s>"),
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja": ("<s>", "</s>"),
    "NVIDIA-Nemotron-Nano-v2.jinja": ("<s>", "</s>"),
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": ("<s>", "</s>"),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": ("<s>", "</s>"),
    "Qwen3-Coder.jinja": ("<s>", "</s>"),
    "Qwen3.5-4B.jinja": ("<s>", "</s>"),
    "Reka-Edge.jinja": ("<s>", "</s>"),
    "Spark2.5.jinja": ("<s>", "</s>"),
    "StepFun3.5-Flash.jinja": ("<s>", "</s>"),
    "deepseek-ai-DeepSeek-V3.1.jinja": ("<s>", "</s>"),
    "deepseek-ai-DeepSeek-V3.2.jinja": ("<s>", "</s>"),
    "deepseek-ai-DeepSeek-V4-Flash-0731.jinja": ("<s>", "</s>"),
    "deepseek-ai-DeepSeek-V4.jinja": ("<s>", "</s>"),
    "fireworks-ai-llama-3-firefunction-v2.jinja": ("<s>", "</s>"),
    "google-gemma-4-31B-it-interleaved.jinja": ("<s>", "</s>"),
    "google-gemma-4-31B-it.jinja": ("<s>", "</s>"),
    "ibm-granite-granite-4.1.jinja": ("<s>", "</s>"),
    "llama-cpp-deepseek-r1.jinja": ("<s>", "</s>"),
    "meetkai-functionary-medium-v3.1.jinja": ("<s>", "</s>"),
    "meetkai-functionary-medium-v3.2.jinja": ("<s>", "</s>"),
    "meta-llama-Llama-3.3-70B-Instruct.jinja": ("<s>", "</s>"),
    "moonshotai-Kimi-K2.jinja": ("<s>", "</s>"),
    "muse-glimmer.jinja": ("<s>", "</s>"),
    "openai-gpt-oss-120b.jinja": ("<s>", "</s>"),
    "poolside-Laguna-S-2.1.jinja": ("<s>", "</s>"),
    "poolside-Laguna-XS-2.1.jinja": ("<s>", "</s>"),
    "poolside-Laguna-XS.2.jinja": ("<s>", "</s>"),
    "tencent-Hy3.jinja": ("<s>", "</s>"),
    "unsloth-Apriel-1.5.jinja": ("<s>", "</s>"),
    "unsloth-mistral-Devstral-Small-2507.jinja": ("<s>", "</s>"),
    "upstage-Solar-Open-100B.jinja": ("<s>", "</s>"),
    "SmolLM2-135M-Instruct.gguf.jinja": ("<|im_start|>", "<|im_end|>"),
    "Qwen-Qwen2.5-7B-Instruct.jinja": ("", "<|im_end|>"),
    "Qwen-Qwen3-0.6B.jinja": ("", "<|im_end|>"),
    "Qwen-QwQ-32B.jinja": ("", "<|im_end|>"),
    "HuggingFaceTB-SmolLM3-3B.jinja": ("", "<|im_end|>"),
    "LFM2-8B-A1B.jinja": ("<|startoftext|>", "<|im_end|>"),
    "LFM2.5-Instruct.jinja": ("<|startoftext|>", "<|im_end|>"),
    "google-gemma-2-2b-it.jinja": ("<bos>", "<eos>"),
    "meta-llama-Llama-3.1-8B-Instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.2-3B-Instruct.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "microsoft-Phi-3.5-mini-instruct.jinja": ("<s>", "<|endoftext|>"),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": ("<s>", "</s>"),
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": ("<s>", "</s>"),
    "ibm-granite-granite-3.3-2B-Instruct.jinja": ("", "<|end_of_text|>"),
    "ibm-granite-granite-4.0.jinja": ("", "<|end_of_text|>"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "inclusionai-ling-3.0-flash.jinja": ("", "<|role_end|>"),
    "llama-cpp-rwkv-world.jinja": ("", "\n\n"),
    "openbmb-MiniCPM5-1B.jinja": ("<s>", "</s>"),
    "Bielik-11B-v3.0-Instruct.jinja": ("<s>", "</s>"),
    "ByteDance-Seed-OSS.jinja": ("<seed:bos>", "<seed:eos>"),
}

CONVERSATIONS = {
    "user": [
        {"role": "user", "content": "Hello"},
    ],
    "system_user": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2+2?"},
    ],
    "multi_turn": [
        {"role": "system", "content": "You are a helpful assistant"},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi there"},
        {"role": "user", "content": "Who are you"},
        {"role": "assistant", "content": "   I am an assistant   "},
        {"role": "user", "content": "Another question"},
    ],
    "no_system": [
        {"role": "user", "content": " padded question \n"},
        {"role": "assistant", "content": "An answer."},
        {"role": "user", "content": "And then?"},
    ],
    "unicode": [
        {"role": "system", "content": "Réponds en français 🙂"},
        {"role": "user", "content": "Ça va? 日本語 «q» \"dq\" 'sq' back\\slash\ttab"},
        {"role": "assistant", "content": "Très bien — merci! <think>no</think>"},
        {"role": "user", "content": "Encore: ünïcödé\n\nligne"},
    ],
    # Content as a list of text parts (OpenAI style); only for Jinja templates.
    "parts": [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "Part one."},
                                     {"type": "text", "text": "Part two."}]},
    ],
}
STRING_CONVS = [k for k in CONVERSATIONS if k != "parts"]


def builtin_names(llama_cpp):
    n = llama_cpp.llama_chat_builtin_templates(None, 0)
    arr = (ctypes.c_char_p * n)()
    llama_cpp.llama_chat_builtin_templates(arr, n)
    return [arr[i].decode() for i in range(n)]


def apply_named(llama_cpp, tmpl, conv, add_ass):
    msgs = (llama_cpp.llama_chat_message * len(conv))()
    keep = []
    for i, m in enumerate(conv):
        r, c = m["role"].encode(), m["content"].encode()
        keep += [r, c]
        msgs[i].role, msgs[i].content = r, c
    size = 1 << 16
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_chat_apply_template(tmpl.encode(), msgs, len(conv), add_ass, buf, size)
    if n < 0:
        return None
    assert n < size
    return buf.raw[:n].decode()


def render_jinja(fmt_cls, text, conv, add_ass, bos, eos, tools=None):
    try:
        fmt = fmt_cls(template=text, eos_token=eos, bos_token=bos, add_generation_prompt=add_ass)
    except Exception as e:  # the template does not parse
        return {"error": type(e).__name__}

    def raise_exception(message):
        raise ValueError(message)

    try:
        # Jinja2ChatFormatter.__call__ without strftime_now (see the module doc).
        return fmt._environment.render(
            messages=conv, eos_token=eos, bos_token=bos, raise_exception=raise_exception,
            add_generation_prompt=add_ass, functions=None, function_call=None,
            tools=tools, tool_choice=None)
    except Exception as e:
        return {"error": type(e).__name__}


C_STR = re.compile(r'(?:U8C\()?u?8?"((?:[^"\\]|\\.)*)"\)?')


def c_unescape(s):
    out, i = bytearray(), 0
    b = s.encode()
    while i < len(b):
        if b[i] == 0x5C:
            n = chr(b[i + 1])
            out += {"n": b"\n", "t": b"\t", "r": b"\r", '"': b'"', "\\": b"\\", "'": b"'"}[n]
            i += 2
        else:
            out.append(b[i])
            i += 1
    return out.decode()


def inline_cases(sdist):
    """The Jinja texts of llama.cpp's tests/test-chat-template.cpp automated test cases."""
    src = open(os.path.join(sdist, "tests", "test-chat-template.cpp"), encoding="utf-8").read()
    cases = []
    for m in re.finditer(r'/\* \.name= \*/\s*"((?:[^"\\]|\\.)*)",\s*/\* \.template_str= \*/((?:\s*(?:U8C\()?u?8?"(?:[^"\\]|\\.)*"\)?)+)', src):
        name = c_unescape(m.group(1))
        text = "".join(c_unescape(p) for p in C_STR.findall(m.group(2)))
        cases.append({"name": name, "template": text})
    return cases


def main():
    sys.path.insert(0, "/root/.cache/pinch/llama-cpp-python")
    import llama_cpp
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    if "--copy" in sys.argv:
        sdist = sys.argv[sys.argv.index("--copy") + 1]
        for f in JINJA_FILES:
            if f.endswith(".gguf.jinja"):
                continue
            shutil.copy(os.path.join(sdist, "models", "templates", f), os.path.join(DATA, f))
        with open(os.path.join(DATA, "test-chat-template-cases.json"), "w", encoding="utf-8") as fh:
            json.dump(inline_cases(sdist), fh, ensure_ascii=False, indent=1)
            fh.write("\n")

    names = builtin_names(llama_cpp)
    named = []
    for name in names:
        for conv in STRING_CONVS:
            for add in (True, False):
                out = apply_named(llama_cpp, name, CONVERSATIONS[conv], add)
                named.append({"template": name, "conv": conv, "add_generation_prompt": add, "out": out})

    jinja_texts = []
    for f, (bos, eos) in JINJA_FILES.items():
        text = open(os.path.join(DATA, f), encoding="utf-8").read()
        jinja_texts.append((f, text, bos, eos))
    cases = json.load(open(os.path.join(DATA, "test-chat-template-cases.json"), encoding="utf-8"))
    for c in cases:
        jinja_texts.append(("test-chat-template-cases.json#" + c["name"], c["template"], "<s>", "</s>"))
    # Small templates written for pinch, one Jinja feature each (jinja2 is the oracle).
    features = json.load(open(os.path.join(DATA, "features.json"), encoding="utf-8"))
    for c in features:
        jinja_texts.append(("features.json#" + c["name"], c["template"], "<s>", "</s>"))

    detected, jinja = [], []
    for src, text, bos, eos in jinja_texts:
        for conv in CONVERSATIONS:
            for add in (True, False):
                if conv in STRING_CONVS and not src.startswith("features.json#"):
                    detected.append({"source": src, "conv": conv, "add_generation_prompt": add,
                                     "out": apply_named(llama_cpp, text, CONVERSATIONS[conv], add)})
                jinja.append({"source": src, "conv": conv, "add_generation_prompt": add,
                              "bos_token": bos, "eos_token": eos,
                              "out": render_jinja(Jinja2ChatFormatter, text, CONVERSATIONS[conv], add, bos, eos)})

    doc = {
        "generator": "tools/gen_chat_templates.py",
        "llama_cpp_python": llama_cpp.__version__,
        "builtin_names": names,
        "conversations": CONVERSATIONS,
        "named": named,
        "detected": detected,
        "jinja": jinja,
    }
    with open(os.path.join(DATA, "expected.json"), "w", encoding="utf-8") as fh:
        json.dump(doc, fh, ensure_ascii=False, indent=0, separators=(",", ":"))
        fh.write("\n")
    ok = sum(1 for j in jinja if isinstance(j["out"], str))
    print(f"{len(names)} names, {len(named)} named, {len(detected)} detected, {ok}/{len(jinja)} jinja renders")


if __name__ == "__main__":
    main()
