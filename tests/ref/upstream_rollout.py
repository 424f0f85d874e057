#!/usr/bin/env python3
"""What the upstream Instruct code does between its text stage and its image
stage, for tests/test-upstream (hi3 tokenize-concat --continue).

upstream's generate_image (hunyuan_image_3/modeling_hunyuan_image_3.py of
suryatmodulus/HunyuanImage-3.0 at 1201fe8, the Instruct code) runs with
image_size "auto": a text stage (think, recaption or think_recaption: the
first task's prefix, the stage transitions, the ratio token chosen greedily;
any other bot_task: one greedy img_ratio token), then it takes the cot from
the generated tokens (up to the first end token, or all of them), applies
drop_think (the cot cut to its <recaption> part, the system prompt switched
to en_recaption's) when generation_config.drop_think says so, maps the last
token to its bucket, and builds the gen_image inputs from the same prompt,
images, system prompt and seed.

Here that code runs as it is, on the objects of tests/ref/upstream_template.py
(the model's configuration, no weights): the model's generate is replaced by
one that returns the prompt followed by the tokens a case says the text
stage generated (for the img_ratio stage, the index of the ratio token in the
ratio slice, which is what upstream's SliceVocabLogitsProcessor makes
generate return), and that stops at the image stage, recording its inputs.
The tokenizer is built as from_pretrained builds it from the model's
tokenizer_config.json (clean_up_tokenization_spaces included), since the cot
is decoded with it. Each case gives:

  request      the hi3 request (mode gen_image, image_size auto)
  drop_think   generation_config.drop_think for the case
  generated    the text stage's token ids (hi3's segment of the row)
  text         the text stage: rows, stops, forced_after, greedy_among (as
               tests/ref/upstream_template.py records them)
  cot_text     the cot generate_image passes to the image stage (null: none)
  system       the system prompt it passes (null: none)
  image_size   [h, w] it passes
  image        the image stage's rows (cond, then uncond without a
               cfg-distilled model)
  error        instead of the above past "text": upstream's exception, when
               it fails (a text stage that did not end at a ratio token)

Sets (--out tests/fixtures/upstream): rollout-tiny-instruct.json,
rollout-tiny-distil.json (the presets of `hi3 init-model`, made here with
$HI3) and rollout-released-instruct.json (tests/fixtures/released/instruct,
the release's special-token ids); the cases with long system prompts
(LONG) in the first alone.

Needs what tests/ref/upstream_template.py needs: the mirror, torch,
torchvision, transformers 4.56 (its Siglip2 fast processor), tokenizers,
pillow.
"""
import argparse
import copy
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import upstream_template as UT  # noqa: E402


class Stop(Exception):
    pass


class Rollout(UT.Upstream):
    """generate_image with a generate that replays given tokens."""

    def __init__(self, mods, model_dir, tokenizer_path, moved_layout):
        super().__init__(mods, model_dir, tokenizer_path, moved_layout)
        tcfg = UT.load(os.path.join(model_dir, "tokenizer_config.json"))
        # from_pretrained passes tokenizer_config.json's values to __init__
        self.tok.clean_up_tokenization_spaces = tcfg.get("clean_up_tokenization_spaces", False)
        self.seen = {}
        seen, tok = self.seen, self.tok
        fake = self.fake
        cls = type(fake)
        base_prepare = cls.prepare_model_inputs

        def prepare(this, *a, **k):
            if k.get("mode") == "gen_image":
                seen["image_call"] = dict(cot_text=k.get("cot_text"), system_prompt=k.get("system_prompt"),
                                          image_size=k.get("image_size"))
            return base_prepare(this, *a, **k)

        def generate(this, *a, **k):
            import torch
            if k.get("mode", "gen_text") == "gen_image":
                seen["image"] = k
                raise Stop()
            seen["text"] = k
            gen = list(seen["generated"])
            procs = k.get("logits_processor") or []
            if any(type(p).__name__ == "SliceVocabLogitsProcessor" for p in procs) and gen:
                # the ratio slice makes generate return the index within it
                ids = tok.get_all_ratio_token_ids()
                gen[-1] = ids.index(gen[-1]) if gen[-1] in ids else gen[-1]
            return torch.cat([k["input_ids"], torch.tensor([gen], dtype=torch.long)], dim=1)

        cls.prepare_model_inputs = prepare
        cls.generate = generate

    def rollout(self, req, generated, drop_think):
        bot_task = req.get("bot_task", self.gen.bot_task)
        name, custom = self.system(req, bot_task)
        self.seen.clear()
        self.seen["generated"] = generated
        self.fake.generation_config.drop_think = drop_think
        res = {}
        try:
            self.fake.generate_image(prompt=req["prompt"], image=self.images(req), cot_text=req.get("cot"),
                                     image_size="auto", use_system_prompt=name, system_prompt=custom,
                                     bot_task=bot_task, seed=req.get("seed", 0))
            raise AssertionError("generate_image did not reach the image stage")
        except Stop:
            pass
        except (ValueError, IndexError) as e:
            res["error"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0])
        finally:
            self.fake.generation_config.drop_think = False
        k = self.seen["text"]
        stops = k.get("final_stop_tokens") if k.get("stage_transitions") else k.get("eos_token_id")
        forced, greedy = self.rules(k)
        res["text"] = {"rows": self.rows_of(k["tokenizer_output"], k["rope_image_info"]),
                       "stops": self.ids_list(stops), "forced_after": forced, "greedy_among": greedy}
        if "error" in res:
            return res
        call = self.seen["image_call"]
        cot = call["cot_text"]      # the CoT stage's is a list of one, the request's a string
        res["cot_text"] = cot[0] if isinstance(cot, list) else cot
        res["system"] = call["system_prompt"] or None
        res["image_size"] = [int(x) for x in call["image_size"]]
        k = self.seen["image"]
        res["image"] = self.rows_of(k["tokenizer_output"], k["rope_image_info"])
        return res


def cases(tok, base):
    """(name, request, generated ids, drop_think), the ids made with the
    model's own tokenizer; base: image_base_size."""
    def enc(text):
        return tok.encode(text, add_special_tokens=False)

    def sp(name):
        return tok.convert_tokens_to_ids(name)

    def ratio(k):
        return sp("<img_ratio_%d>" % k)

    size = sp("<img_size_%d>" % base)
    head = [sp("<answer>"), sp("<boi>"), size]
    vocab = set(tok.get_vocab().values())
    hole = next(i for i in range(1, max(vocab)) if i not in vocab)
    nul = tok.convert_tokens_to_ids("\u0100")     # byte-level's character for the byte 0
    et, r, er = sp("</think>"), sp("<recaption>"), sp("</recaption>")
    think = enc("A fox . It is red , isn't it ? Yes , it 's")
    rec = enc("A red fox 's tail , in snow .")
    fox = {"prompt": "A red fox in the snow.", "mode": "gen_image", "image_size": "auto", "seed": 5}
    out = [
        ("think_recaption", dict(fox, system="None"), think + [et, r] + rec + [er] + head + [ratio(5)], False),
        ("think_recaption-drop-think-switch", dict(fox, system="en_vanilla"),
         think + [et, r] + rec + [er] + head + [ratio(12)], True),
        ("think_recaption-drop-think-none", dict(fox, system="None"),
         think + [et, r] + rec + [er] + head + [ratio(20)], True),
        ("think_recaption-dynamic", dict(fox, system="dynamic"), think + [et, r] + rec + [er] + head + [ratio(0)],
         False),
        ("think", dict(fox, system="None", bot_task="think"), think + [et] + head + [ratio(33)], False),
        ("think-drop-think", dict(fox, system="en_think_recaption", bot_task="think"), think + [et] + head +
         [ratio(36)], True),
        ("recaption", dict(fox, system="en_recaption", bot_task="recaption"), rec + [er] + head + [ratio(16)],
         False),
        ("recaption-drop-think", dict(fox, system="en_recaption", bot_task="recaption"),
         enc("x") + [sp("<think>")] + enc("y") + [er] + head + [ratio(9)], True),
        ("no-end-token", dict(fox, system="None"), think + [ratio(7)], False),
        ("recaption-inside-think", dict(fox, system="None"), think + [er] + head + [ratio(3)], True),
        ("second-recaption", dict(fox, system="en_vanilla"),
         think + [et, r] + enc("a") + [r] + enc("b") + [er] + head + [ratio(30)], True),
        ("bytes-and-holes", dict(fox, system="None"), think[:2] + [nul, hole] + think[2:] + [et, r] + rec +
         [hole, er] + head + [ratio(34)], False),
        ("no-ratio-token", dict(fox, system="None"), think + [et, r] + rec, False),
        ("img_ratio-image", dict(fox, system="dynamic", bot_task="image"), [ratio(24)], False),
        ("img_ratio-auto-cot", dict(fox, system="None", bot_task="auto",
                                    cot="<think>Wide.</think><recaption>A fox, wide.</recaption>"),
         [ratio(35)], True),
        ("img_ratio-task", dict(fox, system="None", bot_task="img_ratio"), [ratio(2)], False),
        ("think_recaption-i2i", dict(fox, system="None", cond_images=[[200, 300], [256, 256]]),
         think + [et, r] + rec + [er] + head + [ratio(18)], False),
    ]
    return out


# cases whose rows hold a long system prompt: tiny-instruct alone has them
# (the other sets differ in the image block and the ids, not in these)
LONG = {"think-drop-think", "recaption", "recaption-drop-think", "second-recaption"}


def run_set(mods, name, model_dir, tok_path, moved, out_dir):
    up = Rollout(mods, model_dir, tok_path, moved)
    res = []
    for case_name, req, generated, drop in cases(up.tok, up.ip.vae_reso_group.base_size):
        if case_name in LONG and name != "tiny-instruct":
            continue
        r = up.rollout(copy.deepcopy(req), generated, drop)
        r = dict({"name": case_name, "request": req, "drop_think": drop, "generated": generated}, **r)
        res.append(r)
    fixture = {"set": name, "upstream": "suryatmodulus/HunyuanImage-3.0@%s hunyuan_image_3/" % UT.COMMIT,
               "tokenizer_hash": UT.fnv(tok_path), "cases": res}
    UT.write_json(os.path.join(out_dir, "rollout-%s.json" % name), fixture)
    print("rollout-%s: %d cases (%d refused)" % (name, len(res), sum("error" in r for r in res)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="tests/fixtures/upstream")
    ap.add_argument("--released", required=True, help="tests/fixtures/released")
    ap.add_argument("--mirror", default=UT.MIRROR)
    args = ap.parse_args()
    hi3 = os.environ.get("HI3", "hi3")
    with tempfile.TemporaryDirectory() as tmp:
        UT.extract(args.mirror, UT.COMMIT, os.path.join(tmp, "up"))
        mods = UT.import_upstream(os.path.join(tmp, "up"))
        for preset in ("tiny-instruct", "tiny-distil"):
            d = os.path.join(tmp, preset)
            subprocess.run([hi3, "-q", "init-model", "--preset", preset, "-o", d], check=True)
            run_set(mods, preset, d, os.path.join(d, "tokenizer.json"), True, args.out)
        d = os.path.join(args.released, "instruct")
        run_set(mods, "released-instruct", d, os.path.join(args.released, "tokenizer.json"), False, args.out)


if __name__ == "__main__":
    main()
