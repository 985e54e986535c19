"""Config loading: strict keys and types, overrides, and a reference YAML that documents every key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from cometnmt.config import Config, apply_overrides, load_config, to_dict
from cometnmt.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


def flat_keys(d: dict, prefix: str = "") -> set[str]:
    keys = set()
    for k, v in d.items():
        dotted = f"{prefix}{k}"
        keys |= flat_keys(v, dotted + ".") if isinstance(v, dict) else {dotted}
    return keys


def test_reference_yaml_documents_every_key_with_its_default():
    ref = yaml.safe_load((REPO / "configs" / "reference.yaml").read_text(encoding="utf-8"))
    assert flat_keys(ref) == flat_keys(to_dict(Config()))
    assert ref == to_dict(Config()), "reference.yaml values must be the defaults"


def test_every_preset_loads():
    presets = sorted((REPO / "configs").rglob("*.yaml"))
    assert len(presets) >= 3
    for path in presets:
        if path.name == "reference.yaml" or "iwslt" in path.parts:
            continue
        load_config(path)


def test_a_split_names_both_its_files_or_neither():
    """data.test_src without data.test_tgt (or the reverse) was accepted silently: ignored under
    data.corpus multi30k, and under files a failure only when the test split was read."""
    iwslt = REPO / "configs" / "iwslt" / "convs2s_iwslt.yaml"
    files = [f"data.{split}_{side}=/c/{split}.{side}" for split in ("train", "valid") for side in ("src", "tgt")]
    assert load_config(iwslt, files).data.test_src is None  # the test pair is optional...
    assert load_config(iwslt, files + ["data.test_src=/c/t.de", "data.test_tgt=/c/t.en"]).data.test_tgt == "/c/t.en"
    for half, given, unset in (("data.test_src=/c/t.de", "data.test_src is '/c/t.de'", "data.test_tgt is null"),
                               ("data.test_tgt=/c/t.en", "data.test_tgt is '/c/t.en'", "data.test_src is null")):
        with pytest.raises(ConfigError, match=f"^config keys 'data.test_src' and 'data.test_tgt' go together: {given} but "
                                              f"{unset}; set both or neither$"):  # ...but whole
            load_config(iwslt, files + [half])
    for split in ("train", "valid"):  # required, and named as a pair too
        with pytest.raises(ConfigError, match=f"'data.{split}_src' and 'data.{split}_tgt' go together: data.{split}_tgt is "
                                              f"'/c/{split}.tgt' but data.{split}_src is null; set both \\(the {split} split is required\\)"):
            load_config(iwslt, [f for f in files if not f.startswith(f"data.{split}_src")])
    with pytest.raises(ConfigError, match="'data.valid_src' and 'data.valid_tgt': required when data.corpus is 'files'; "
                                          r"without a validation set, hold out .* \(tail -n 500 FILE > dev.FILE; "
                                          r"head -n \$\(\(\$\(wc -l < FILE\) - 500\)\) FILE > train.FILE, "
                                          r"for data.train_src and data.train_tgt\)$"):
        load_config(iwslt, files[:2])
    for key in ("data.multi30k_dir", "data.train_src", "data.test_tgt"):  # `--set data.multi30k_dir=$UNSET_VAR`
        for empty in ("", "'  '"):  # was taken for the default without a word
            with pytest.raises(ConfigError, match=f"^config key '{key}': empty; give a path, or null for the default$"):
                load_config(iwslt, files + [f"{key}={empty}"])
    with pytest.raises(ConfigError, match="data.test_src is 'a.de' but data.test_tgt is null; set both or neither "
                                          "\\(data.corpus is 'multi30k', which reads neither"):
        load_config(REPO / "configs" / "tiny.yaml", ["data.test_src=a.de"])


def test_overrides_and_types(tmp_path):
    cfg = load_config(REPO / "configs" / "tiny.yaml", ["train.lr=3e-4", "model.comet.features=[8,4]", "model.comet.dilations=[1,2]", "data.max_len=50"])
    assert cfg.train.lr == pytest.approx(3e-4) and cfg.model.comet.features == [8, 4] and cfg.data.max_len == 50
    with pytest.raises(ConfigError, match="model.d_model"):
        load_config(None, ["model.d_model=2.5"])
    with pytest.raises(ConfigError, match="'data.nope'"):
        load_config(None, ["data.nope=1"])
    with pytest.raises(ConfigError, match="model.n_heads"):
        load_config(None, ["model.n_heads=7"])
    for key in ("train.bucket_width", "train.batch_sentences"):
        with pytest.raises(ConfigError, match=f"'{key}': must be at least 1"):
            load_config(None, [f"{key}=0"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2]\n")
    with pytest.raises(ConfigError, match="train"):
        load_config(bad)


def test_defaults_are_the_papers_transformer():
    m = Config().model
    assert (m.enc_layers, m.d_model, m.n_heads, m.d_ff, m.dropout) == (3, 256, 8, 2048, 0.1)
    t = Config().train
    assert (t.lr, t.betas, t.eps) == (1e-4, [0.9, 0.98], 1e-9)


def test_reference_yaml_gives_each_key_one_line():
    """model.transformer_pp.ner_types' default was wrapped onto a second line indented less than its
    key: PyYAML reads it, a YAML 1.2 parser need not, and a user copying the key's line got half a list."""
    from cometnmt.config import reference_yaml

    for line in reference_yaml().splitlines():
        assert line.lstrip().startswith("#") or re.match(r"^( *)\w+:( |$)", line), line


def test_reference_yaml_says_what_the_less_evident_keys_do():
    """train.attention_plots and data.train_src had their comments on the lines above the field, which
    the generator does not read: reference.yaml listed them bare ("attention_plots: 0")."""
    ref = (REPO / "configs" / "reference.yaml").read_text(encoding="utf-8")
    for key in ("attention_plots", "train_src"):
        assert re.search(rf"^ +{key}: [^#\n]+  # \S", ref, re.M), key


def test_reference_yaml_comments_every_key():
    """docs/configuration.md says reference.yaml gives every key's meaning, but some 60 of its keys (name, data.corpus,
    model.d_model, train.clip_norm, decode.beam_size, ...) were listed bare: their dataclass fields had
    no inline comment for the generator to read. A new field without one fails here."""
    from cometnmt.config import reference_yaml

    bare = [line.strip() for line in reference_yaml().splitlines()
            if not line.lstrip().startswith("#") and not line.endswith(":") and not re.search(r"  # \S", line)]
    assert not bare, f"keys without an inline comment in their dataclass: {bare}"


def test_reference_yaml_gives_the_type_of_a_key_whose_default_is_null():
    """A null default shows no type: reference.yaml said "max_steps: null" and "multi30k_dir: null" with
    nothing telling an integer from a path or a list (bn_length_bounds). Their comments now start with
    the schema's type, generated (not written out a second time)."""
    import dataclasses
    import typing

    from cometnmt.config import _type_name

    ref = (REPO / "configs" / "reference.yaml").read_text(encoding="utf-8")

    def check(cls):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            value = getattr(cls(), f.name)
            if dataclasses.is_dataclass(value):
                yield from check(type(value))
            elif value is None:
                assert re.search(rf"^ +{f.name}: null  # \({re.escape(_type_name(hints[f.name]))}\) \S", ref, re.M), f.name
                yield f.name

    assert {"multi30k_dir", "max_steps", "bn_length_bounds", "embed_dropout"} <= set(check(Config))


def test_reference_yaml_says_that_nbest_beside_greedy_search_is_a_beam_search():
    """decode.method: greedy with decode.nbest: 3 loads, and translate and serve then search with a
    beam of decode.beam_size (as --nbest 3 alone does); reference.yaml said method greedy and "the
    beam's best" without a word of it."""
    from cometnmt.config import DecodeConfig
    from cometnmt.inference import decode_config

    decode = decode_config(load_config(None, ["decode.nbest=3"]).decode)
    assert (decode.method, decode.beam_size, decode.nbest) == ("beam", DecodeConfig().beam_size, 3)
    ref = (REPO / "configs" / "reference.yaml").read_text(encoding="utf-8")
    assert re.search(r"^  nbest: 1  # .*method greedy too: a beam of beam_size", ref, re.M)


def test_reference_yaml_is_up_to_date():
    from cometnmt.config import reference_yaml

    assert (REPO / "configs" / "reference.yaml").read_text(encoding="utf-8") == reference_yaml(), (
        "regenerate with: python -m cometnmt.config > configs/reference.yaml"
    )


def test_attention_dropout_is_checked_and_named():
    assert load_config(None, ["model.attention_dropout=0.25"]).model.attention_dropout == 0.25
    with pytest.raises(ConfigError, match="'model.attention_dropout': 1.0 must be in"):
        load_config(None, ["model.attention_dropout=1.0"])
    with pytest.raises(ConfigError, match="model.transformer_pp.attention_dropout instead"):
        load_config(None, ["model.arch=transformer_pp", "model.attention_dropout=0.1"])
    with pytest.raises(ConfigError, match="not 'rnn'"):
        load_config(None, ["model.arch=rnn", "model.attention_dropout=0.1"])


@pytest.mark.parametrize("overrides, needle", [
    (["train.log_every=0"], "'train.log_every': must be at least 1"),
    (["model.arch=transformer_pp", "model.enc_layers=3", "model.transformer_pp.tag_cache_dir="],  # was the default cache
     "config key 'model.transformer_pp.tag_cache_dir': empty; give a folder, or null for the default"),
    (["data.tgt_lang=cs"], "config key 'data.tgt_lang': 'cs' is not a language of Multi30k task 1 that this package knows; "
                           "expected one of de, en, fr (other files: data.corpus: files)"),
    (["data.src_lang=en"], "config keys 'data.src_lang' and 'data.tgt_lang': both 'en'; Multi30k's source and target"),
    (["train.device=gpu"], "config key 'train.device': 'gpu' is not a device; use auto, cpu, cuda or cuda:N"),
    (["train.device=cuda:x"], "config key 'train.device': 'cuda:x' is not a device"),
    (["train.seed=99999999999999999999999"], "'train.seed': must be in [0, 2**63), got 99999999999999999999999"),
    (["train.seed=-1"], "'train.seed': must be in [0, 2**63), got -1"),
    (["decode.sampling_seed=9223372036854775808"], "'decode.sampling_seed': must be in [0, 2**63) (or null)"),
    (["model.arch=rnn", "model.tie_embeddings=true"], "'model.tie_embeddings': applies to the transformer, comet, "
                                                      "transformer_pp architectures, not 'rnn'"),
    (["model.arch=convs2s", "model.tie_embeddings=true"], "'model.tie_embeddings': applies to the transformer"),
    (["train.stopping=bleu_patience", "train.valid_bleu=false"], "needs train.valid_bleu: true"),
    (["train.valid_bleu_max_sentences=0"], "'train.valid_bleu_max_sentences': must be at least 1 (or null)"),
    (["train.schedule=inverse_sqrt", "train.warmup_steps=0"], "'train.warmup_steps': must be at least 1 with"),
    (["train.keep_checkpoints=-1"], "'train.keep_checkpoints': must be at least 0"),
    (["train.patience=0"], "'train.patience': must be at least 1"),
    (["train.loss_rise_epochs=0"], "'train.loss_rise_epochs': must be at least 1"),
    (["data.max_vocab=2"], "'data.max_vocab': must be at least 5"),
    (["data.tokenizer=sentencepiece", "data.sp_vocab_size=0"], "'data.sp_vocab_size': must be at least 5"),
    (["data.test_split=test_2017_flickr"], "'data.test_split': 'test_2017_flickr' is not a Multi30k task-1 split"),
    (["model.comet.features=[]"], "'model.comet.features': needs at least one layer"),
    (["model.comet.dilations=[1]"], "'model.comet.dilations': one dilation of at least 1 per layer"),
    (["model.comet.leaky_slope=.nan"], "'model.comet.leaky_slope': must be a finite number, got nan"),
    (["model.comet.kernel_size=0"], "'model.comet.kernel_size': must be at least 1"),
    (["model.comet.bn_length_bounds=[5, 3]"], "'model.comet.bn_length_bounds': ascending positive"),
    (["model.comet.batch_norm=false", "model.comet.bn_length_bounds=[8]"],
     "'model.comet.bn_length_bounds': only applies with batch norm (model.comet.batch_norm true), got batch_norm False"),
    (["decode.sampling_topk=-1"], "config key 'decode.sampling_topk': must be at least 0 (0: the whole vocabulary), got -1"),
    (["decode.sampling_topp=0"], "config key 'decode.sampling_topp': 0.0 must be in (0, 1] (1: off)"),
    (["decode.sampling_topp=1.5"], "config key 'decode.sampling_topp': 1.5 must be in (0, 1] (1: off)"),
    (["decode.temperature=0"], "config key 'decode.temperature': must be a positive finite number, got 0.0"),
    (["decode.temperature=.inf"], "config key 'decode.temperature': must be a positive finite number, got inf"),
    (["decode.temperature=1e-46"], "config key 'decode.temperature': must be from 1e-30 to 1e+30"),  # 0 in float32
    (["decode.temperature=1e39"], "config key 'decode.temperature': must be from 1e-30 to 1e+30"),  # inf in float32
    (["decode.sampling_seed=-3"], "config key 'decode.sampling_seed': must be in [0, 2**63) (or null), got -3"),
    (["decode.sampling_seed=1.5"], "config key 'decode.sampling_seed': expected"),
    (["decode.method=sampling"], "'decode.method': 'sampling' is not allowed; expected one of 'greedy', 'beam', 'sample'"),
    (["decode.length_penalty=.nan"], "config key 'decode.length_penalty': must be a number from 0 to 10, got nan"),
    (["decode.length_penalty=-1"], "config key 'decode.length_penalty': must be a number from 0 to 10, got -1.0"),
    (["decode.length_penalty=400"], "config key 'decode.length_penalty': must be a number from 0 to 10, got 400.0"),
    (["decode.max_len_a=-1"], "config key 'decode.max_len_a': must be a finite number at least 0, got -1.0"),
    (["decode.max_len_a=.nan"], "config key 'decode.max_len_a': must be a finite number at least 0, got nan"),
    (["decode.max_len_b=-2"], "config key 'decode.max_len_b': must be at least 0, got -2"),
    (["decode.max_len_a=0", "decode.max_len_b=0"], "config key 'decode.max_len_b': must be at least 1 with decode.max_len_a: 0"),
    (["train.num_threads=-1"], "config key 'train.num_threads': must be at least 1 (or null: torch's default), got -1"),
    (["train.num_threads=0"], "config key 'train.num_threads': must be at least 1"),  # was ignored without a word
    (["train.distributed_timeout_minutes=0"],
     "config key 'train.distributed_timeout_minutes': must be a positive finite number of minutes, got 0.0"),
    (["train.distributed_timeout_minutes=.nan"], "config key 'train.distributed_timeout_minutes': must be a positive finite"),
    (["data.min_freq=-5"], "config key 'data.min_freq': must be at least 1 (1 keeps every word), got -5"),
    (["train.betas=[1.5, 0.98]"], "config key 'train.betas': Adam's two decay rates must be in [0, 1), got [1.5, 0.98]"),
    (["train.betas=[0.9, .nan]"], "config key 'train.betas': Adam's two decay rates must be in [0, 1), got [0.9, nan]"),
])
def test_values_that_used_to_fail_mid_run_are_config_errors(overrides, needle):
    """Each of these trained until a traceback after an epoch, or (warmup 0) silently at lr 0; the
    sampling keys' ranges are checked as they load too, and train.device's spelling (it was checked
    only as training started; whether the machine has the device still is), as are Multi30k's
    languages (compare and reproduce trained the other configs' runs before one with 'cs' failed)."""
    with pytest.raises(ConfigError) as info:
        load_config(REPO / "configs" / "tiny.yaml", overrides)
    assert needle in str(info.value)


def test_config_files_that_cannot_be_read_are_named(tmp_path):
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(ConfigError, match=r"latin.yaml: not valid UTF-8 \(byte 0xe9 at offset 9\)"):
        load_config(latin)
    broken = tmp_path / "broken.yaml"
    broken.write_text("train:\n  lr: [1\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(broken)
    assert str(info.value).startswith(f"{broken}: not valid YAML") and "<unicode string>" not in str(info.value)
    assert "\n" not in str(info.value)  # one line
    blank = tmp_path / "blank.yaml"  # was read as "all defaults" and trained a full Multi30k model
    blank.write_text("# nothing yet\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"blank.yaml: empty; a config sets at least one section"):
        load_config(blank)
    folder = tmp_path / "configs"
    folder.mkdir()
    with pytest.raises(ConfigError, match=r"configs: is a folder, expected a YAML config file"):
        load_config(folder)


def test_a_key_given_twice_is_named_with_its_lines(tmp_path):
    """PyYAML kept the last of two equal keys silently: the lr the user edited on line 3 was
    replaced by line 5's and the run trained at another learning rate."""
    twice = tmp_path / "twice.yaml"
    twice.write_text(f"base: {REPO / 'configs' / 'tiny.yaml'}\ntrain:\n  lr: 1e-3\n  max_epochs: 1\n  lr: 5e-4\n",
                     encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(twice)
    message = str(info.value)
    assert message.startswith(f"{twice}: not valid YAML: found the key 'lr' a second time (first on line 3; keep one)")
    assert "line 5" in message and "\n" not in message
    same_name = tmp_path / "sections.yaml"  # one name in two sections, and a '<<' merge overridden, are fine
    same_name.write_text(f"base: {REPO / 'configs' / 'tiny.yaml'}\nsrc: &s {{lr: 1e-3}}\ntrain:\n  <<: *s\n  lr: 2e-3\n"
                         "model:\n  dropout: 0.2\ndecode:\n  batch_sentences: 7\n", encoding="utf-8")
    from cometnmt.config import yaml_load

    assert yaml_load(same_name.read_text(encoding="utf-8"))["train"] == {"lr": 0.002}


@pytest.mark.parametrize("override", ["train.lr=[1", "train.betas={a: 1, a: 2}", "train.lr=a: b: c"])
def test_an_override_that_is_not_yaml_is_named(override):
    """--set with a value YAML cannot read ended in a yaml traceback (exit 1), not the one-line error."""
    with pytest.raises(ConfigError) as info:
        load_config(REPO / "configs" / "tiny.yaml", [override])
    assert str(info.value).startswith(f"override '{override}': the value is not valid YAML") and "\n" not in str(info.value)


def test_numbers_in_scientific_notation_are_numbers_in_files_as_in_overrides(tmp_path):
    """PyYAML (YAML 1.1) read lr: 1e-3 as the string '1e-3', refused as 'expected a number'."""
    mine = tmp_path / "mine.yaml"
    mine.write_text(f"base: {REPO / 'configs' / 'tiny.yaml'}\ntrain:\n  lr: 1e-3\n  weight_decay: 5E-5\n", encoding="utf-8")
    cfg = load_config(mine)
    assert (cfg.train.lr, cfg.train.weight_decay) == (0.001, 0.00005)
    assert load_config(mine, ["train.lr=2.5e-4"]).train.lr == 0.00025
    assert load_config(mine, ["name=e5"]).name == "e5"  # not a number: stays text


def test_yes_no_on_off_are_text_as_in_yaml_1_2(tmp_path):
    """YAML 1.1 (PyYAML's) read yes, no, on and off as booleans: data.src_lang: no, Norwegian, was the
    boolean false and refused ("expected a string, got False"). As in YAML 1.2 they are text, in a
    file as in --set; a boolean key given one says that only true and false are booleans."""
    from cometnmt.config import yaml_dump, yaml_load

    mine = tmp_path / "no.yaml"
    mine.write_text("data:\n  corpus: files\n  src_lang: no\n  tgt_lang: en\n  train_src: a.no\n  train_tgt: a.en\n"
                    "  valid_src: b.no\n  valid_tgt: b.en\nname: Off\n", encoding="utf-8")
    cfg = load_config(mine)
    assert (cfg.data.src_lang, cfg.name) == ("no", "Off")
    assert load_config(mine, ["data.tgt_lang=on", "name=YES"]).data.tgt_lang == "on"
    assert yaml_load("[yes, No, ON, off, y, n, true, False, TRUE]") == ["yes", "No", "ON", "off", "y", "n", True, False, True]
    assert yaml_load(yaml_dump({"name": "no", "save_dir": "true"})) == {"name": "no", "save_dir": "true"}
    for word in ("yes", "off"):
        with pytest.raises(ConfigError, match=rf"^config key 'train.compile': expected true or false, got '{word}'; "
                                              r"YAML 1.2 reads only true and false as booleans$"):
            load_config(REPO / "configs" / "tiny.yaml", [f"train.compile={word}"])
    with pytest.raises(ConfigError, match=r"^config key 'train.stopping': 'no' is not allowed; expected one of "
                                          r"'loss_rise', 'bleu_patience', 'none'$"):
        load_config(REPO / "configs" / "tiny.yaml", ["train.stopping=no"])


def test_yaml_readings_and_sections(tmp_path):
    with pytest.raises(ConfigError, match=r"got False; YAML reads false unquoted as the boolean false: "
                                          r"quote it, e.g. data.src_lang='false'$"):
        load_config(REPO / "configs" / "tiny.yaml", ["data.src_lang=False"])
    with pytest.raises(ConfigError, match=r"got True; YAML reads true unquoted as the boolean true: "
                                          r"quote it, e.g. data.tgt_lang='true'$"):
        load_config(REPO / "configs" / "tiny.yaml", ["data.tgt_lang=TRUE"])
    assert load_config(REPO / "configs" / "tiny.yaml", ["name='no'"]).name == "no"
    # a choice of strings read as a boolean or number says why, without a quoting hint that would not help
    with pytest.raises(ConfigError, match=r"'train.stopping': False is not allowed; expected one of .*'none'; "
                                          r"YAML reads false unquoted as the boolean false$"):
        load_config(REPO / "configs" / "tiny.yaml", ["train.stopping=false"])
    with pytest.raises(ConfigError, match=r"'train.precision': 16 is not allowed; .*; YAML reads an unquoted number as a number$"):
        load_config(REPO / "configs" / "tiny.yaml", ["train.precision=16"])
    empty = tmp_path / "empty.yaml"
    empty.write_text("data:\nmodel:\n  arch: comet\n", encoding="utf-8")
    assert load_config(empty).data.corpus == "multi30k"  # an empty section keeps its defaults
    child = tmp_path / "child.yaml"
    child.write_text("base: missing.yaml\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"missing.yaml \(the base of .*child.yaml\)"):
        load_config(child)
    with pytest.raises(ConfigError, match="'model.enc_layers': 1 is too few"):  # before any tagger runs
        load_config(REPO / "configs" / "tiny.yaml", ["model.arch=transformer_pp", "model.enc_layers=1"])
    # POS alone (unit 1) needs one plain unit after it, 2 in all; NER (unit 2) needs 3 (POS alone asked for 3)
    assert load_config(REPO / "configs" / "tiny.yaml", ["model.arch=transformer_pp", "model.transformer_pp.tasks=[pos]",
                                                       "model.enc_layers=2"]).model.enc_layers == 2
    with pytest.raises(ConfigError, match=r"'model.enc_layers': 2 is too few for .*\['ner'\].* \(>= 3\)"):
        load_config(REPO / "configs" / "tiny.yaml", ["model.arch=transformer_pp", "model.transformer_pp.tasks=[ner]",
                                                    "model.enc_layers=2"])


@pytest.mark.parametrize("override, key, value", [("name='2024'", "name", "2024"), ('name="2024"', "name", "2024"),
                                                  ("name='nan'", "name", "nan"), ("train.save_dir='1e5'", "train.save_dir", "1e5"),
                                                  ("name=2024x", "name", "2024x")])
def test_a_quoted_override_stays_a_string(override, key, value):
    """--set turned every string Python reads as a number into one, quoted or not, so a name, a
    save_dir or a file called 2024 could not be given, and the error's own hint (quote it) failed."""
    cfg = load_config(REPO / "configs" / "tiny.yaml", [override])
    section, _, name = key.rpartition(".")
    assert getattr(getattr(cfg, section) if section else cfg, name) == value
    with pytest.raises(ConfigError, match=r"config key 'name': expected a string, got nan"):  # unquoted: a number
        load_config(REPO / "configs" / "tiny.yaml", ["name=nan"])
    with pytest.raises(ConfigError, match=r"got 100000.0; YAML reads an unquoted number as a number: quote the value as you "
                                          r"wrote it$"):  # was: e.g. name='100000.0', another name than 1e5
        load_config(REPO / "configs" / "tiny.yaml", ["name=1e5"])
    with pytest.raises(ConfigError, match=r"got 2024; YAML reads an unquoted number as a number: quote the value, e.g. "
                                          r"name='2024'$"):
        load_config(REPO / "configs" / "tiny.yaml", ["name=2024"])


def test_a_tilde_in_a_config_path_is_the_home_folder(tmp_path, monkeypatch):
    """base: ~/presets/tiny.yaml was looked for in a folder named '~' beside the child ("config file
    not found: .../~/presets/tiny.yaml"), and load_config('~/x.yaml') in one under the current
    folder, though "~" is the home folder in the data paths and train.save_dir."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home" / "presets").mkdir(parents=True)
    (tmp_path / "home" / "presets" / "tiny.yaml").write_text((REPO / "configs" / "tiny.yaml").read_text(encoding="utf-8"),
                                                             encoding="utf-8")
    child = tmp_path / "home" / "child.yaml"
    child.write_text("base: ~/presets/tiny.yaml\nname: child\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    for path in (child, "~/child.yaml"):
        cfg = load_config(path)
        assert (cfg.name, cfg.model.d_model) == ("child", load_config(REPO / "configs" / "tiny.yaml").model.d_model)
    child.write_text("base: ~\nname: child\n", encoding="utf-8")  # ~ alone is YAML's null: no base
    assert load_config(child).data.max_train_pairs is None


def test_an_error_in_a_base_names_the_base(tmp_path):
    """A wrong key in a base file was reported against the child config, the wrong file to edit."""
    (tmp_path / "bad_base.yaml").write_text(f"base: {REPO / 'configs' / 'tiny.yaml'}\ndata:\n  lowercase: maybe\n",
                                            encoding="utf-8")
    (tmp_path / "child.yaml").write_text("base: bad_base.yaml\ntrain:\n  lr: 0.1\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad_base.yaml: config key 'data.lowercase': expected true or false, got "
                                          r"'maybe' \(the base of .*child.yaml\)$"):
        load_config(tmp_path / "child.yaml")
    (tmp_path / "child.yaml").write_text("base: bad_base.yaml\ndata:\n  lowercase: nope\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad_base.yaml: config key 'data.lowercase'"):  # the base's own error first
        load_config(tmp_path / "child.yaml")


def test_sampling_config_takes_more_samples_than_the_beam():
    cfg = load_config(REPO / "configs" / "tiny.yaml", ["decode.method=sample", "decode.nbest=8", "decode.beam_size=2",
                                                       "decode.sampling_topk=10", "decode.sampling_topp=0.9",
                                                       "decode.temperature=0.7", "decode.sampling_seed=5"])
    assert (cfg.decode.method, cfg.decode.nbest, cfg.decode.sampling_seed) == ("sample", 8, 5)
    with pytest.raises(ConfigError, match="'decode.nbest': 8 exceeds decode.beam_size=2"):
        load_config(REPO / "configs" / "tiny.yaml", ["decode.method=beam", "decode.nbest=8", "decode.beam_size=2"])


def test_keys_the_architecture_does_not_read_are_listed():
    """model.d_model or model.rnn.hidden_size beside arch: convs2s trained silently without them;
    train now warns with this list (values away from their defaults only), and the position limit
    is named by the key that sets it."""
    from cometnmt.config import positions_key, unused_model_keys

    cfg = load_config(None, ["model.arch=convs2s", "model.d_model=32", "model.rnn.hidden_size=1024",
                             "model.comet.kernel_size=4", "model.convs2s.embed_dim=64"])
    assert unused_model_keys(cfg.model) == ["model.d_model=32", "model.comet.kernel_size=4", "model.rnn.hidden_size=1024"]
    assert positions_key(cfg.model) == "model.convs2s.max_positions"
    cfg = load_config(None, ["model.arch=comet", "model.d_model=32", "model.comet.kernel_size=5", "model.rnn.cell=lstm"])
    assert unused_model_keys(cfg.model) == ["model.rnn.cell='lstm'"] and positions_key(cfg.model) == "model.max_positions"
    for path in sorted((REPO / "configs").rglob("*.yaml")):  # no preset sets a key its architecture ignores
        if "iwslt" not in path.parts and path.name != "reference.yaml":
            assert unused_model_keys(load_config(path).model) == [], path


def test_an_architecture_a_script_registered_reads_the_shared_keys_and_may_tie_embeddings(monkeypatch):
    """docs/architectures.md: a script's architecture (REGISTRY["mine"] = build_mine) reads the shared model.*
    keys. train still warned "model.arch=mine does not use model.d_model=64, model.n_heads=4, ...
    (trained without them: check model.arch)" of the very sizes it was built with, and refused
    model.tie_embeddings ("applies to the transformer, comet, transformer_pp architectures, not
    'mine'") for a Transformer variant that ties them. Now no warning for such an architecture
    (its builder may read any key), and tie_embeddings is left to its model: tied where it defines
    tie_embeddings(), else a ConfigError naming the key when it is built."""
    import torch

    from cometnmt.config import unused_model_keys
    from cometnmt.models import REGISTRY, build_model
    from cometnmt.models.base import Seq2Seq

    class Untied(Seq2Seq):
        encode = decode = init_state = step = lambda self, *args: None

    monkeypatch.setitem(REGISTRY, "mine", REGISTRY["transformer"])
    monkeypatch.setitem(REGISTRY, "untied", lambda cfg, s, t, p: Untied(p))
    cfg = load_config(None, ["model.arch=mine", "model.d_model=32", "model.n_heads=4", "model.comet.kernel_size=5",
                             "model.tie_embeddings=true"])
    assert unused_model_keys(cfg.model) == []
    model = build_model(cfg.model, 11, 13, 0)
    assert model.out_proj.weight is model.tgt_embed.embed.weight and model.out_proj.weight.shape == torch.Size([13, 32])
    cfg = load_config(None, ["model.arch=untied", "model.tie_embeddings=true"])
    with pytest.raises(ConfigError, match=r"^config key 'model.tie_embeddings': Untied, built by the builder registered "
                                          r"as 'untied', does not define tie_embeddings\(\)"):
        build_model(cfg.model, 11, 13, 0)


@pytest.fixture
def dwconv(tmp_path, monkeypatch):
    """conftest's plugin file registering 'dwconv' with its section model.dwconv, imported as the CLI
    imports $COMETNMT_PLUGINS; unregistered afterwards."""
    import sys

    from conftest import write_dwconv_plugin

    from cometnmt.models import REGISTRY, SECTIONS, load_plugins

    monkeypatch.setenv("COMETNMT_PLUGINS", str(write_dwconv_plugin(tmp_path)))
    load_plugins()
    yield
    REGISTRY.pop("dwconv", None)
    SECTIONS.pop("dwconv", None)
    for name in [name for name in sys.modules if name.startswith("cometnmt_plugin_dwconv_plugin_")]:
        del sys.modules[name]


def test_an_architectures_own_section_is_checked_saved_and_reaches_its_builder(dwconv, tmp_path):
    """An architecture of one's own could have no section ("unknown config key 'model.dwconv'"):
    its builder read the shared keys or another architecture's. register_architecture(name,
    builder, config=...) now declares model.<name>.*, checked as the package's sections (unknown
    key, type and choice errors name the key and the file), read by the builder as
    model_cfg.<name>, written to the saved config and read back; beside another architecture it is
    an unused key as model.comet.* is beside a Transformer, and absent unless set."""
    from cometnmt.config import config_from_dict, unused_model_keys, yaml_dump, yaml_load
    from cometnmt.models import SECTIONS, build_model

    cfg = load_config(REPO / "configs" / "tiny.yaml", ["model.arch=dwconv", "model.dwconv.kernel_size=5"])
    model = build_model(cfg.model, 11, 13, 0)
    assert (model.built_with.kernel_size, model.built_with.padding) == (5, "same")
    saved = yaml_load(yaml_dump(to_dict(cfg)))  # a run's config.yaml, as its checkpoints keep it
    assert saved["model"]["dwconv"] == {"kernel_size": 5, "padding": "same"}
    assert config_from_dict(saved).model.dwconv.kernel_size == 5
    assert load_config(None, ["model.arch=dwconv"]).model.dwconv.kernel_size == 3  # its defaults, unset
    merged = load_config(None, ["model.arch=dwconv", "model.dwconv.kernel_size=5", "model.dwconv={padding: causal}"])
    assert (merged.model.dwconv.kernel_size, merged.model.dwconv.padding) == (5, "causal")  # key by key, as the package's
    path = tmp_path / "dwconv.yaml"
    for line, error in (("kernal_size: 5", r"unknown config key 'model.dwconv.kernal_size'; allowed keys here: kernel_size, padding"),
                        ("kernel_size: five", r"config key 'model.dwconv.kernel_size': expected an integer, got 'five'"),
                        ("padding: left", r"config key 'model.dwconv.padding': 'left' is not allowed; expected one of 'same', 'causal'")):
        path.write_text(f"base: {REPO / 'configs' / 'tiny.yaml'}\nmodel:\n  arch: dwconv\n  dwconv:\n    {line}\n", encoding="utf-8")
        with pytest.raises(ConfigError, match=f"^{re.escape(str(path))}: {error}$"):
            load_config(path)
    with pytest.raises(ConfigError, match=r"^config key 'model.dwconv.kernel_size': expected an integer, got 2.5$"):
        load_config(None, ["model.arch=dwconv", "model.dwconv.kernel_size=2.5"])
    with pytest.raises(ConfigError, match=r"^override 'model.dwconv=null': 'model.dwconv' is a section, not a value") as info:
        load_config(None, ["model.dwconv=null"])
    # its keys are not in configs/reference.yaml, which the error named: the registered dataclass lists them
    assert str(info.value).endswith("set its keys, model.dwconv.KEY=VALUE (the dataclass "
                                    f"{SECTIONS['dwconv'].__module__}.{SECTIONS['dwconv'].__qualname__} registered "
                                    "for 'dwconv' lists them)"), str(info.value)
    assert "dwconv" not in to_dict(load_config(None))["model"]  # another architecture's checkpoints need no plugin
    beside = load_config(None, ["model.arch=transformer", "model.dwconv.kernel_size=5", "model.comet.kernel_size=5"])
    assert unused_model_keys(beside.model) == ["model.comet.kernel_size=5", "model.dwconv.kernel_size=5"]


def test_an_unregistered_section_and_a_section_that_cannot_be_one_are_named(monkeypatch):
    """A section whose architecture is not registered says where sections come from; register_architecture
    refuses a name that is a key of the package's own and a class that is no config section; a
    section's own check (a ValueError in its __post_init__) is an error naming the section."""
    from dataclasses import dataclass, field

    from cometnmt.models import REGISTRY, SECTIONS, register_architecture

    monkeypatch.delenv("COMETNMT_PLUGINS", raising=False)
    with pytest.raises(ConfigError, match=r"^unknown config key 'model.dwconv'; allowed keys here: arch, d_model, .*, "
                                          r"transformer_pp; the section of an architecture of one's own is known once .* "
                                          r"name it in \$COMETNMT_PLUGINS$"):
        load_config(None, ["model.dwconv.kernel_size=5"])

    @dataclass
    class NoDefault:
        kernel_size: int

    @dataclass
    class Mapping:
        sizes: dict = field(default_factory=dict)

    build = REGISTRY["transformer"]
    with pytest.raises(ConfigError, match=r"^register_architecture\('comet', \.\.\., config='NoDefault'\): 'model.comet' is a "
                                          r"key of the package's own"):
        register_architecture("comet", build, config=NoDefault)
    with pytest.raises(ConfigError, match=r"config must be a dataclass .* got an int"):
        register_architecture("mine", build, config=3)
    with pytest.raises(ConfigError, match=r"NoDefault cannot be a config section: .*missing 1 required positional argument"):
        register_architecture("mine", build, config=NoDefault)
    with pytest.raises(ConfigError, match=r"Mapping cannot be a config section: unsupported config type .* for 'model.mine.sizes'"):
        register_architecture("mine", build, config=Mapping)
    assert "mine" not in REGISTRY and "mine" not in SECTIONS

    @dataclass
    class Odd:
        kernel_size: int = 3  # its own check: odd

        def __post_init__(self):
            if self.kernel_size % 2 == 0:
                raise ValueError(f"kernel_size must be odd, got {self.kernel_size}")

    monkeypatch.setitem(REGISTRY, "mine", build)  # removed again after the test
    monkeypatch.setitem(SECTIONS, "mine", Odd)
    register_architecture("mine", build, config=Odd)
    assert load_config(None, ["model.arch=mine", "model.mine.kernel_size=5"]).model.mine.kernel_size == 5
    with pytest.raises(ConfigError, match=r"^config key 'model.mine': ValueError: kernel_size must be odd, got 4$"):
        load_config(None, ["model.arch=mine", "model.mine.kernel_size=4"])


def test_an_architecture_registered_with_uses_is_warned_of_the_keys_it_does_not_read(monkeypatch):
    """train warned of no unused model key for an architecture of one's own: model.d_ff=512 beside a
    builder that never reads it trained without it and without a word (unused_model_keys was []).
    register_architecture(..., uses=(...)) now declares the shared keys and package sections its
    builder reads, and the others set away from their defaults are listed as for ConvS2S; its own
    section and model.tie_embeddings (build_model's, through the model) are not. Registered without
    uses, any key may be read and none is listed; a uses that is no tuple of such names is refused."""
    from dataclasses import dataclass

    from cometnmt.config import unused_model_keys
    from cometnmt.models import REGISTRY, SECTIONS, USES, register_architecture

    @dataclass
    class Mine:
        width: int = 3

    build = REGISTRY["transformer"]
    for table in (REGISTRY, SECTIONS, USES):
        monkeypatch.setitem(table, "mine", None)  # removed again after the test
    register_architecture("mine", build, config=Mine, uses=("d_model", "n_heads", "enc_layers", "dec_layers", "dropout",
                                                            "max_positions", "comet"))
    overrides = ["model.arch=mine", "model.d_model=32", "model.n_heads=4", "model.d_ff=512", "model.comet.kernel_size=5",
                 "model.rnn.cell=lstm", "model.mine.width=5", "model.tie_embeddings=true"]
    assert unused_model_keys(load_config(None, overrides).model) == ["model.d_ff=512", "model.rnn.cell='lstm'"]
    register_architecture("mine", build, config=Mine)  # again, without uses: its builder may read any key
    assert "mine" not in USES and unused_model_keys(load_config(None, overrides).model) == []
    with pytest.raises(ConfigError, match=r"^register_architecture\('mine', \.\.\.\): uses must be a tuple of key names "
                                          r"such as \('d_model', 'n_heads'\), got 'd_model'$"):
        register_architecture("mine", build, uses="d_model")
    with pytest.raises(ConfigError, match=r"^register_architecture\('mine', \.\.\., config='Mine'\): uses names "
                                          r"'tie_embeddings', 'width', not a shared model key or section a builder reads; "
                                          r"expected some of d_model, n_heads, .*, max_positions, comet, convs2s, rnn, transformer_pp$"):
        register_architecture("mine", build, config=Mine, uses=("d_model", "tie_embeddings", "width"))
    assert "mine" not in USES and SECTIONS["mine"] is Mine  # refused: registered as before


def test_the_shared_sizes_an_architecture_of_ones_own_reads_are_checked(dwconv, monkeypatch):
    """validate() checked the shared sizes for the Transformer family only: model.d_model: 0 with an
    architecture of one's own reached its builder ("ZeroDivisionError: 0.0 cannot be raised to a
    negative power" from the embeddings), and model.attention_dropout was refused for dwconv, whose
    builder (build_transformer's) reads it. Registered without uses=, its builder may read any
    shared key: every size must be at least 1, model.dropout in [0, 1) and model.n_heads must divide
    model.d_model, the error saying why;
    registered with uses=(...), the keys it names are checked as the Transformer's (d_model divisible
    by n_heads where it reads both) and the others not, nor data.max_len against model.max_positions."""
    from cometnmt.models import REGISTRY, USES, register_architecture

    for override, error in (("model.d_model=0", "'model.d_model': must be at least 1, got 0"),
                            ("model.d_ff=-1", "'model.d_ff': must be at least 1, got -1"),
                            ("model.dropout=1.5", r"'model.dropout': 1.5 must be in \[0, 1\)")):
        with pytest.raises(ConfigError, match=rf"^config key {error} \(model.arch 'dwconv' was registered without "
                                              r"uses=\(\.\.\.\), so its builder may read any shared key; "
                                              r"register_architecture\('dwconv', \.\.\., uses=\.\.\.\) names those it reads\)$"):
            load_config(None, ["model.arch=dwconv", override])
    assert load_config(None, ["model.arch=dwconv", "model.attention_dropout=0.1"]).model.attention_dropout == 0.1
    # d_model not divisible by n_heads was the builder's to judge (dwconv's, build_transformer's, failed
    # in its attention): checked for every architecture that may read both
    with pytest.raises(ConfigError, match=r"^config key 'model.n_heads': 8 does not divide model.d_model=30 \(model.arch "
                                          r"'dwconv' was registered without uses=\(\.\.\.\), so its builder may read any"):
        load_config(None, ["model.arch=dwconv", "model.d_model=30"])
    assert load_config(None, ["model.arch=dwconv", "model.d_model=32"]).model.d_model == 32

    build = REGISTRY["transformer"]
    monkeypatch.setitem(REGISTRY, "mine", build)  # removed again after the test
    monkeypatch.setitem(USES, "mine", frozenset())
    register_architecture("mine", build, uses=("d_model", "n_heads", "enc_layers", "dec_layers", "d_ff", "dropout", "max_positions"))
    with pytest.raises(ConfigError, match=r"^config key 'model.d_model': must be at least 1, got 0$"):
        load_config(None, ["model.arch=mine", "model.d_model=0"])
    with pytest.raises(ConfigError, match=r"^config key 'model.n_heads': 7 does not divide model.d_model=256$"):
        load_config(None, ["model.arch=mine", "model.n_heads=7"])
    with pytest.raises(ConfigError, match=r"^config key 'model.attention_dropout': applies to the transformer and comet "
                                          r"architectures and those that declare it, not 'mine'; register_architecture"
                                          r"\('mine', \.\.\., uses=\.\.\.\) does not name it$"):
        load_config(None, ["model.arch=mine", "model.attention_dropout=0.1"])
    register_architecture("mine", build, uses=("enc_layers",))
    cfg = load_config(None, ["model.arch=mine", "model.d_model=0", "model.n_heads=7", "model.dropout=1.5",
                             "model.max_positions=8"])  # read by nothing: warned of by train, not refused
    assert (cfg.model.d_model, cfg.model.n_heads, cfg.model.max_positions) == (0, 7, 8)
    with pytest.raises(ConfigError, match=r"^config key 'model.enc_layers': must be at least 1, got 0$"):
        load_config(None, ["model.arch=mine", "model.enc_layers=0"])


def test_a_mistyped_arch_names_the_file_and_the_closest_architecture(tmp_path):
    """model.arch: transfomer in a file was "config key 'model.arch': 'transfomer' is not allowed;
    expected one of ...", naming no file (checked after the overrides, not with the file's other
    keys) and leaving the reader to spot the typo. It now names the file (the base's, for a base)
    and the closest registered name."""
    path = tmp_path / "mine.yaml"
    path.write_text(f"base: {REPO / 'configs' / 'tiny.yaml'}\nmodel:\n  arch: transfomer\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: config key 'model.arch': 'transfomer' is not allowed; "
                                          r"expected one of comet, convs2s, .*transformer_pp; did you mean 'transformer'\?$"):
        load_config(path)
    child = tmp_path / "child.yaml"
    child.write_text("base: mine.yaml\ntrain:\n  lr: 0.001\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: config key 'model.arch': 'transfomer' .* \(the base of "):
        load_config(child)
    with pytest.raises(ConfigError, match=r"^config key 'model.arch': 'comte' is not allowed; .*; did you mean 'comet'\?$"):
        load_config(None, ["model.arch=comte"])
    with pytest.raises(ConfigError, match=r"^config key 'model.arch': 'lstm' is not allowed; expected one of [^;]*$"):
        load_config(None, ["model.arch=lstm"])  # nothing close: no guess


def test_an_arch_that_an_override_or_a_child_replaces_is_not_refused(tmp_path, monkeypatch):
    """model.arch was checked against the registry with the file's other keys, before the overrides:
    a file with a typo there, or naming the architecture of a plugin not loaded, was refused although
    --set model.arch=transformer (or a child's arch:) replaced it. The file's keys and types are
    still checked, naming the file; the name that replaces it is checked where it is given."""
    monkeypatch.delenv("COMETNMT_PLUGINS", raising=False)
    tiny = REPO / "configs" / "tiny.yaml"
    for arch in ("transfomer", "dwconv"):  # a typo; an architecture of a plugin not loaded
        path = tmp_path / f"{arch}.yaml"
        path.write_text(f"base: {tiny}\nmodel:\n  arch: {arch}\n  d_model: 32\n", encoding="utf-8")
        cfg = load_config(path, ["model.arch=transformer"])
        assert (cfg.model.arch, cfg.model.d_model) == ("transformer", 32)
        assert load_config(path, ["model={arch: comet}"]).model.arch == "comet"
        child = tmp_path / f"child_{arch}.yaml"
        child.write_text(f"base: {arch}.yaml\nmodel:\n  arch: rnn\n", encoding="utf-8")
        assert load_config(child).model.arch == "rnn"
        with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: config key 'model.arch': '{arch}' is not allowed"):
            load_config(path, ["train.lr=0.001"])  # not replaced: still refused, naming the file
    path = tmp_path / "typo.yaml"
    path.write_text(f"base: {tiny}\nmodel:\n  arch: transfomer\n  d_modl: 32\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: unknown config key 'model.d_modl'"):
        load_config(path, ["model.arch=transformer"])  # the file's other keys: checked, naming the file
    with pytest.raises(ConfigError, match=r"^config key 'model.arch': 'tranformer' is not allowed; .*did you mean 'transformer'\?$"):
        load_config(path.with_name("transfomer.yaml"), ["model.arch=tranformer"])  # the override's name: checked


def test_a_value_a_rule_refuses_names_the_file_that_set_it(tmp_path):
    """train.lr: -1 in a file was "config key 'train.lr': must be a positive finite number, got
    -1.0", naming no file: the rules on values and across keys run once the file and the overrides
    are merged. The error now names the file of the base chain that set the key (a base as the file
    checks name one); an override's value is named as before, without a file."""
    tiny = REPO / "configs" / "tiny.yaml"
    path = tmp_path / "mine.yaml"
    path.write_text(f"base: {tiny}\ntrain:\n  lr: -1\nmodel:\n  n_heads: 3\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: config key 'train.lr': must be a positive finite number, got -1.0$"):
        load_config(path)
    child = tmp_path / "child.yaml"
    child.write_text("base: mine.yaml\nname: child\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: config key 'train.lr': .* \(the base of {re.escape(str(child))}\)$"):
        load_config(child)
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: config key 'model.n_heads': 3 does not divide model.d_model=64 "):
        load_config(child, ["train.lr=0.001", "data.max_len=60"])  # a rule across keys: the file setting the key it names
    wide = tmp_path / "wide.yaml"
    wide.write_text("model:\n  d_model: 100\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(wide))}: config key 'model.n_heads': 8 does not divide model.d_model=100$"):
        load_config(wide)  # the key it names is a default: the file loaded
    with pytest.raises(ConfigError, match=r"^config key 'train.lr': must be a positive finite number, got -2.0$"):
        load_config(path, ["train.lr=-2"])  # the override's value: no file to name
    with pytest.raises(ConfigError, match=r"^config key 'model.n_heads': 3 does not divide model.d_model=100$"):
        load_config(path, ["train.lr=0.001", "model.d_model=100"])  # the rule's other key is the override's
    split = tmp_path / "split.yaml"
    split.write_text(f"base: {tiny}\ndata:\n  test_src: a.txt\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(split))}: config keys 'data.test_src' and 'data.test_tgt' go together"):
        load_config(split)


def test_whether_an_override_or_a_file_gave_a_refused_value_comes_from_the_error_s_keys(tmp_path):
    """load_config told an override's error from a file's by regular expressions over the message:
    any word starting with a section's name counted as a key, so a message's prose ("the model's 8
    positions", the split list "train, val, ...") made any model.* or train.* override the culprit
    and the file went unnamed. A ConfigError now carries the keys its message names (the refused one
    first) and the loader compares the overrides with those."""
    tiny = REPO / "configs" / "tiny.yaml"
    path = tmp_path / "mine.yaml"
    path.write_text(f"base: {tiny}\ndata:\n  train_split: trian\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: config key 'data.train_split': 'trian' is not a "
                                          r"Multi30k task-1 split this package knows; expected one of train, val, "):
        load_config(path, ["train.lr=0.001"])
    with pytest.raises(ConfigError) as caught:
        load_config(path, ["data.corpus=multi30k"])  # a key the rule names: the override's error, no file
    assert caught.value.keys == ("data.train_split", "data.corpus") and str(caught.value).startswith("config key ")
    path.write_text(f"base: {tiny}\nmodel:\n  max_positions: 8\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: config keys 'data.max_len' and 'model.max_positions': "
                                          r"100 tokens .* exceed the model's 8 positions; lower data.max_len or raise "):
        load_config(path, ["model.d_model=32", "model.n_heads=4"])  # data.max_len, a default: the file loaded
    with pytest.raises(ConfigError) as caught:
        load_config(path, ["model.max_positions=4"])
    assert caught.value.keys == ("data.max_len", "model.max_positions", "model.arch") and str(caught.value).startswith("config keys ")


def test_a_rule_that_depends_on_the_architecture_blames_an_override_of_model_arch(tmp_path, monkeypatch):
    """The rules that hold for some architectures only (model.tie_embeddings, model.attention_dropout)
    and data.max_len's, whose positions are the architecture's, name or depend on the architecture
    but did not put model.arch in their keys: ``--set model.arch=convs2s`` over a file setting
    ``tie_embeddings: true`` (right for its transformer) was blamed on the file. The override that made the value wrong is now the error's, without a file;
    the file is named still where it set the architecture too. Likewise HanTa's "the source language
    is 'fr'" names data.src_lang in its keys."""
    tiny = REPO / "configs" / "tiny.yaml"
    path = tmp_path / "mine.yaml"
    for key, value in (("tie_embeddings", "true"), ("attention_dropout", "0.1")):
        path.write_text(f"base: {tiny}\nmodel:\n  {key}: {value}\n", encoding="utf-8")
        load_config(path)  # right for the file's transformer
        for arch in ("convs2s", "rnn"):
            with pytest.raises(ConfigError, match=rf"^config key 'model.{key}': applies to the .*, not '{arch}'"):
                load_config(path, [f"model.arch={arch}"])  # was "PATH: config key ..."
            with pytest.raises(ConfigError) as caught:
                load_config(path, [f"model={{arch: {arch}}}"])
            assert "model.arch" in caught.value.keys and not str(caught.value).startswith(str(path))
        path.write_text(f"base: {tiny}\nmodel:\n  arch: rnn\n  {key}: {value}\n", encoding="utf-8")
        with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: config key 'model.{key}': applies to "):
            load_config(path, ["train.lr=0.001"])  # the file set both: the file's error
    # the positions data.max_len must fit are the architecture's (model.convs2s.max_positions for convs2s):
    # a file's convs2s table, which its transformer never read, was blamed for --set model.arch=convs2s
    path.write_text(f"base: {tiny}\nmodel:\n  convs2s:\n    max_positions: 8\n", encoding="utf-8")
    load_config(path)
    for arch in ("model.arch=convs2s", "model={arch: convs2s}"):
        with pytest.raises(ConfigError, match=r"^config keys 'data.max_len' and 'model.convs2s.max_positions': 100 tokens ") as caught:
            load_config(path, [arch])  # was "PATH: config keys ..."
        assert caught.value.keys == ("data.max_len", "model.convs2s.max_positions", "model.arch")
    path.write_text(f"base: {tiny}\nmodel:\n  arch: convs2s\n  convs2s:\n    max_positions: 8\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: config keys 'data.max_len' and 'model.convs2s.max_positions'"):
        load_config(path, ["train.lr=0.001"])  # the file set both: the file's error
    # data.src_sos_eos takes two positions around sources where the target's BOS takes one: an override
    # turning it on over a file whose max_len fitted was blamed on the file (its keys lacked it)
    path.write_text(f"base: {tiny}\nmodel:\n  max_positions: 101\ndata:\n  max_len: 100\n", encoding="utf-8")
    load_config(path)
    with pytest.raises(ConfigError, match=r"^config keys 'data.max_len' and 'model.max_positions': 100 tokens \(\+2") as caught:
        load_config(path, ["data.src_sos_eos=true"])
    assert "data.src_sos_eos" in caught.value.keys
    from cometnmt.training.run import check_positions

    cfg = load_config(path, ["data.src_sos_eos=true", "model.max_positions=102"])
    with pytest.raises(ConfigError, match=r"^config key 'data.max_len': 100 tokens \(\+2 .*\(model.max_positions\)") as caught:
        check_positions(cfg, 101, None, None)  # train's own check (--init-from's tables): the same keys
    assert caught.value.keys == ("data.max_len", "model.max_positions", "model.arch", "data.src_sos_eos")
    from cometnmt.config import name_origin
    from cometnmt.data import tagging

    monkeypatch.setattr(tagging, "_installed", lambda name: True)
    path.write_text(f"base: {tiny}\nmodel:\n  arch: transformer_pp\n  transformer_pp:\n    tasks: [pos]\n"
                    "    pos_tagger: hanta\n", encoding="utf-8")
    cfg = load_config(path, ["data.src_lang=fr", "data.tgt_lang=en"])
    with pytest.raises(ConfigError, match="HanTa is used for German POS here, but the source language is 'fr'") as caught:
        tagging.resolve_tagger("pos", "hanta", cfg.data.src_lang)
    assert caught.value.keys == ("model.transformer_pp.pos_tagger", "data.src_lang")
    assert name_origin(caught.value, path, ["data.src_lang=fr", "data.tgt_lang=en"]) is caught.value  # was "PATH: ..."
    assert str(name_origin(caught.value, path, [])) == f"{path}: {caught.value}"
    import spacy  # a pipeline for another language than the source, and 'auto' finding none for it: the same

    monkeypatch.setattr(spacy, "load", lambda name, exclude=(): type("Nlp", (), {"lang": "de"})())
    with pytest.raises(ConfigError, match="is for language 'de', the source is 'fr'") as caught:
        tagging.SpacyAnnotator("de_core_news_sm", ("pos",), "fr", "model.transformer_pp.pos_tagger")
    assert caught.value.keys == ("model.transformer_pp.pos_tagger", "data.src_lang")
    monkeypatch.setattr(tagging, "_installed", lambda name: False)
    with pytest.raises(ConfigError, match="found no installed POS tagger for source language 'fr'") as caught:
        tagging.resolve_tagger("pos", "auto", "fr")
    assert caught.value.keys == ("model.transformer_pp.pos_tagger", "data.src_lang")


def test_a_data_error_on_a_file_a_config_key_named_names_the_override_or_the_file(tmp_path):
    """The DataErrors of the files that config keys name ("config key 'data.train_src': a.de: file
    not found", a tab-separated file, a Multi30k folder without the split) carried no keys, so
    training could not say whether a --set override or the file had named the file: a file's
    missing data.train_src named no config file. They carry their keys as ConfigErrors do, and
    name_origin names them the same way, as DataErrors."""
    import cometnmt
    from cometnmt.errors import DataError

    tiny = REPO / "configs" / "tiny.yaml"
    (tmp_path / "a.en").write_text("A dog.\n", encoding="utf-8")
    (tmp_path / "pairs.tsv").write_text("Ein Hund.\tA dog.\n", encoding="utf-8")
    path = tmp_path / "mine.yaml"
    files = (f"base: {tiny}\ndata:\n  corpus: files\n  train_src: {tmp_path / '{}'}\n  train_tgt: {tmp_path / 'a.en'}\n"
             f"  valid_src: {tmp_path / 'a.en'}\n  valid_tgt: {tmp_path / 'a.en'}\n")
    save = [f"train.save_dir={tmp_path / 'run'}"]
    for name, text in (("a.de", "config key 'data.train_src': .*a.de: file not found"),
                       ("pairs.tsv", "config key 'data.train_src': every line of .*pairs.tsv holds a tab")):
        path.write_text(files.format(name), encoding="utf-8")
        with pytest.raises(DataError, match=rf"^{re.escape(str(path))}: {text}") as caught:  # was "config key ..."
            cometnmt.train(path, save)
        assert caught.value.keys == ("data.train_src",)
        with pytest.raises(DataError, match=rf"^{text}"):  # the override's file: no config file named
            cometnmt.train(path, [*save, f"data.train_src={tmp_path / name}"])
    (tmp_path / "m30k").mkdir()
    path.write_text(f"base: {tiny}\ndata:\n  multi30k_dir: {tmp_path / 'm30k'}\n", encoding="utf-8")
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}: .*train.de.gz: file not found; the Multi30k "
                                      r"directory given by config key 'data.multi30k_dir' must hold ") as caught:
        cometnmt.train(path, save)
    assert caught.value.keys == ("data.multi30k_dir",)


def test_training_s_own_checks_name_the_override_or_the_file_that_gave_the_refused_value(tmp_path, monkeypatch):
    """The checks training makes itself, on file pairs data.corpus multi30k would ignore, on the
    model the architecture's builder returned and on tie_embeddings there, raised ConfigError
    without keys, so nothing could say whether a --set override or the file had given the value:
    ``cometnmt train`` and cometnmt.train named no file for a file's data.train_src, and compare's
    and reproduce's check before any run named the preset for an override's. They now carry their
    keys, and the file of the base chain that set one is named (name_origin, as load_config names
    its own rules' errors); an override's error stays as it is."""
    import cometnmt
    from cometnmt import experiments
    from cometnmt.models import REGISTRY, build_model
    from cometnmt.models.base import Seq2Seq

    tiny = REPO / "configs" / "tiny.yaml"
    path = tmp_path / "mine.yaml"
    path.write_text(f"base: {tiny}\ndata:\n  train_src: a.de\n  train_tgt: a.en\n", encoding="utf-8")
    unread = "config keys 'data.train_src', 'data.train_tgt': set, but data.corpus is 'multi30k', which reads no file pairs"
    save = [f"train.save_dir={tmp_path / 'run'}"]
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: {re.escape(unread)}"):
        cometnmt.train(path, save)
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: {re.escape(unread)}"):
        experiments.check_run_configs([(path, load_config(path, save))], save)
    overrides = [*save, "data.train_src=a.de", "data.train_tgt=a.en"]
    with pytest.raises(ConfigError, match=rf"^{re.escape(unread)}"):
        cometnmt.train(tiny, overrides)
    with pytest.raises(ConfigError, match=rf"^{re.escape(unread)}"):  # was "configs/tiny.yaml: config keys ..."
        experiments.check_run_configs([(tiny, load_config(tiny, overrides))], overrides)
    assert not (tmp_path / "run").exists()
    from cometnmt.config import name_origin

    class Untied(Seq2Seq):
        encode = decode = init_state = step = lambda self, *args: None

    monkeypatch.setitem(REGISTRY, "plain_module", lambda cfg, s, t, p: __import__("torch").nn.Linear(2, 2))
    monkeypatch.setitem(REGISTRY, "untied", lambda cfg, s, t, p: Untied(p))
    for arch, tie, refused in (("plain_module", "false", "model.arch"), ("untied", "true", "model.tie_embeddings")):
        path.write_text(f"base: {tiny}\nmodel:\n  arch: {arch}\n  tie_embeddings: {tie}\n", encoding="utf-8")
        with pytest.raises(ConfigError) as caught:
            build_model(load_config(path).model, 11, 13, 0)
        assert caught.value.keys[0] == refused and str(caught.value).startswith(f"config key '{refused}': ")
        assert str(name_origin(caught.value, path, [])) == f"{path}: {caught.value}"
        assert name_origin(caught.value, path, [f"{refused}={arch if refused == 'model.arch' else tie}"]) is caught.value
    path.unlink()  # a file removed (or broken) while the run prepared its data: the error names it still, no traceback
    assert str(name_origin(caught.value, path, [])) == f"{path}: {caught.value}"
    path.write_text("model: [\n", encoding="utf-8")
    assert str(name_origin(caught.value, path, [])) == f"{path}: {caught.value}"


# Bad configs whose errors test_a_config_error_names_in_its_keys_every_config_key_its_message_names scans:
# a rule of every kind (a type, a section's own check, a rule across keys, a file's value, a base's).
BAD_OVERRIDES = [
    ["model.d_model=0"], ["model.n_heads=3"], ["model.arch=transformer_pp", "model.attention_dropout=0.1"],
    ["model.arch=convs2s", "model.tie_embeddings=true"], ["model.arch=transfomer"], ["train.lr=-1"], ["train.betas=[0.9]"],
    ["train.schedule=inverse_sqrt", "train.warmup_steps=0"], ["train.stopping=bleu_patience", "train.valid_bleu=false"],
    ["data.train_split=trian"], ["data.tgt_lang=de", "data.src_lang=de"], ["decode.replace_unk=true", "data.tokenizer=sentencepiece"],
    ["model.max_positions=8"], ["decode.nbest=9", "decode.beam_size=2"], ["decode.max_len_a=0", "decode.max_len_b=0"],
    ["data.train_src="], ["data.test_src=a.txt"], ["data.corpus=files"], ["model.nope=1"], ["train.lr=abc"],
    ["train.betas=[0.9, x]"], ["train.compile=maybe"], ["model.comet.dilations=[1]"], ["model.comet.decoder_bn_length_bounds=[2]"],
    ["model.arch=convs2s", "model.convs2s.enc_layers=[[1]]"], ["model.arch=rnn", "model.rnn.hidden_size=3"],
    ["model.arch=transformer_pp", "model.transformer_pp.kernel_sizes=[3]"], ["model.arch=transformer_pp", "model.enc_layers=1"],
    ["model.arch=transformer_pp", "model.transformer_pp.conv_heads=99"], ["model.comet=3"],
]
BAD_FILES = ["train:\n  lr: -1\n", "train:\n  lr: abc\n", "model:\n  nope: 1\n", "base: 3\n", "data:\n  test_src: a.txt\n",
             "model:\n  max_positions: 8\n", "data:\n  train_src: a.de\n  train_tgt: a.en\n"]


def test_a_config_error_names_in_its_keys_every_config_key_its_message_names(tmp_path, monkeypatch):
    """A ConfigError's keys (the config keys its message names, from which load_config tells an
    override's error from a file's) were written beside the message at each raise site, and some
    sites (the unknown key, a file's own check wrapping a key's error, training's checks) had none,
    so that the two drifted apart unseen. Every ConfigError made while a table of bad configs loads
    (from overrides and from a file, for a base too) and while training's own checks run must have
    in its keys each key its message names as "config key 'X'" or "config keys 'X' and 'Y'"."""
    import cometnmt
    from cometnmt.config import check_unread_files
    from cometnmt.data.tagging import check_cache_dir, resolve_tagger

    made = []
    init = ConfigError.__init__

    def recording(self, message, keys=()):
        init(self, message, keys)
        made.append(self)

    monkeypatch.setattr(ConfigError, "__init__", recording)
    tiny = REPO / "configs" / "tiny.yaml"
    for overrides in BAD_OVERRIDES:
        with pytest.raises(ConfigError):
            load_config(tiny, overrides)
    for i, text in enumerate(BAD_FILES):
        base = tmp_path / f"base{i}.yaml"
        base.write_text(text if text.startswith("base:") else f"base: {tiny}\n{text}", encoding="utf-8")
        (tmp_path / f"child{i}.yaml").write_text(f"base: {base.name}\nname: child\n", encoding="utf-8")
        for path in (base, tmp_path / f"child{i}.yaml"):
            with pytest.raises(ConfigError):
                check_unread_files(load_config(path).data)  # the last file: loads, but training refuses it
    with pytest.raises(ConfigError):
        cometnmt.train(tiny, ["train.save_dir=' '"])
    with pytest.raises(ConfigError):
        resolve_tagger("pos", "spacy:", "de")
    (tmp_path / "file").write_text("", encoding="utf-8")
    with pytest.raises(ConfigError):
        check_cache_dir(load_config(tiny, ["model.arch=transformer_pp", f"model.transformer_pp.tag_cache_dir={tmp_path / 'file'}"]
                                    ).model.transformer_pp)
    named_keys = re.compile(r"config keys? ('[^']+'(?:(?:, | and )'[^']+')*)")
    checked = 0
    for exc in made:
        for listed in named_keys.findall(str(exc)):
            checked += 1
            for key in re.findall(r"'([^']+)'", listed):
                assert key in exc.keys, f"{exc!s} names config key {key!r}, but its keys are {exc.keys}"
    assert checked >= len(BAD_OVERRIDES) + 2 * len(BAD_FILES)


def test_a_list_written_without_brackets_gets_the_brackets_hint():
    """--set train.betas=0.9,0.98 said only "expected list of float, got '0.9,0.98'"."""
    with pytest.raises(ConfigError, match=r"^config key 'train.betas': expected list of float, got '0.9,0.98'; a list is "
                                          r"written in brackets: \[0.9,0.98\]$"):
        load_config(REPO / "configs" / "tiny.yaml", ["train.betas=0.9,0.98"])
    assert load_config(REPO / "configs" / "tiny.yaml", ["train.betas=[0.9,0.98]"]).train.betas == [0.9, 0.98]
    with pytest.raises(ConfigError, match=r"got '\(0.9, 0.98\)'; a list is written in brackets: \[0.9, 0.98\]$"):  # was [(0.9, 0.98)]
        load_config(REPO / "configs" / "tiny.yaml", ["train.betas=(0.9, 0.98)"])


def test_an_empty_section_in_a_child_keeps_the_base_section(tmp_path):
    """A child whose ``model:`` had every key commented out (YAML null) replaced the base's whole
    model section with the defaults: a child of comet.yaml trained a 256-wide Transformer silently."""
    child = tmp_path / "child.yaml"
    child.write_text(f"base: {REPO / 'configs' / 'multi30k' / 'comet_conv4.yaml'}\nmodel:\n  # d_model: 128\n"
                     "train:\n  max_epochs: 3\n", encoding="utf-8")
    cfg = load_config(child)
    assert (cfg.model.arch, cfg.model.comet.features, cfg.train.max_epochs) == ("comet", [64, 32, 16, 8], 3)
    child.write_text(f"base: {REPO / 'configs' / 'multi30k' / 'comet_conv4.yaml'}\nmodel:\n  comet:\n", encoding="utf-8")
    assert load_config(child).model.comet.dilations == [1, 2, 3, 4]  # nested sections too
    child.write_text(f"base: {REPO / 'configs' / 'multi30k' / 'comet_bn_length.yaml'}\nmodel:\n  comet:\n"
                     "    bn_length_bounds: null\n", encoding="utf-8")
    assert load_config(child).model.comet.bn_length_bounds is None  # a null value still overrides the base's


def test_an_override_into_an_empty_section(tmp_path):
    """A file with an empty section (``data:``, null to YAML) loads with its defaults, but
    ``--set data.max_len=50`` on it failed: "override 'data.max_len': 'data' is not a section"."""
    empty = tmp_path / "empty.yaml"
    empty.write_text("data:\nmodel:\n  arch: comet\n  comet:\n", encoding="utf-8")
    cfg = load_config(empty, ["data.max_len=50", "model.comet.kernel_size=5"])
    assert (cfg.data.max_len, cfg.model.comet.kernel_size, cfg.model.arch) == (50, 5, "comet")
    with pytest.raises(ConfigError, match="override 'model.arch.x': 'arch' is not a section"):  # a value still is not one
        load_config(empty, ["model.arch.x=1"])


def test_a_section_set_to_null_is_refused():
    """--set model.comet=null reset the section to the defaults (comet_bn_length.yaml lost its
    bn_length_bounds; --set model=null trained a Transformer), while an empty section in a child keeps
    the base's: one null, two meanings. Null for a section is now refused, naming the section."""
    for key in ("model.comet", "model", "data"):
        for written in ("null", "~"):
            with pytest.raises(ConfigError, match=rf"^override '{key}=null': '{key}' is a section, not a value \(null "
                                                  rf"neither resets nor clears it\); set its keys, {key}.KEY=VALUE"):
                load_config(REPO / "configs" / "multi30k" / "comet_bn_length.yaml", [f"{key}={written}"])
        with pytest.raises(ConfigError, match=rf"^override '{key}=null': '{key}' is a section"):
            apply_overrides(Config(), [f"{key}=null"])
    cfg = load_config(REPO / "configs" / "multi30k" / "comet_bn_length.yaml", ["model.comet.bn_length_bounds=null"])
    assert (cfg.model.arch, cfg.model.comet.bn_length_bounds) == ("comet", None)  # a key that may be null still may


def test_a_section_set_to_null_inside_a_mapping_is_refused_too():
    """--set 'model={comet: null}' kept the base's comet section without a word (a mapping merges
    key by key, and a null section kept the base's), where --set model.comet=null is refused: the
    nested form is refused the same way, naming the section, at any depth and from the defaults too."""
    preset = REPO / "configs" / "multi30k" / "comet_bn_length.yaml"
    for text, key in (("model={comet: null}", "model.comet"), ("model={arch: comet, transformer_pp: ~}", "model.transformer_pp"),
                      ("model={comet: {bn_length_bounds: [10]}, transformer_pp: null}", "model.transformer_pp")):
        with pytest.raises(ConfigError, match=rf"^override '{re.escape(text)}': '{key}' is a section, not a value \(null "
                                              rf"neither resets nor clears it\); set its keys, {key}.KEY=VALUE"):
            load_config(preset, [text])
        with pytest.raises(ConfigError, match=rf"^override '{re.escape(text)}': '{key}' is a section"):
            apply_overrides(Config(), [text])
    cfg = load_config(preset, ["model={comet: {bn_length_bounds: null}}"])  # a key that may be null still may
    assert (cfg.model.arch, cfg.model.comet.bn_length_bounds, cfg.model.comet.kernel_size) == ("comet", None, 3)


def test_a_section_given_as_a_mapping_merges_as_in_a_file(tmp_path):
    """--set 'model.comet={kernel_size: 5}' replaced the whole section: comet_bn_length.yaml's other
    comet keys fell back to their defaults (bn_length_bounds null: no length-bucketed batch norm),
    without a word, while the same mapping in a child file merges key by key over the base's."""
    preset = REPO / "configs" / "multi30k" / "comet_bn_length.yaml"
    child = tmp_path / "child.yaml"
    child.write_text(f"base: {preset}\nmodel:\n  comet: {{kernel_size: 5}}\n", encoding="utf-8")
    from_file = load_config(child)
    for overrides in (["model.comet={kernel_size: 5}"], ["model={comet: {kernel_size: 5}}"]):
        for cfg in (load_config(preset, overrides), apply_overrides(load_config(preset), overrides)):
            assert cfg.model.comet.bn_length_bounds == [8, 11, 14, 18] and cfg.model.comet.kernel_size == 5
            assert cfg == from_file
    assert load_config(preset, ["model.comet={bn_length_bounds: null}"]).model.comet.bn_length_bounds is None


def test_language_codes_are_case_insensitive():
    """data.src_lang: DE was refused once training read the data ("'DE' is not a language of Multi30k
    task 1 ... expected one of de, en, fr"), and with data.corpus files spaCy had no tokenizer for
    'DE'; evaluate --lang EN meanwhile took EN as en. A code is now lower-cased as it loads."""
    from cometnmt.data.pipeline import split_files

    cfg = load_config(REPO / "configs" / "tiny.yaml", ["data.src_lang=DE", "data.tgt_lang=En"])
    assert (cfg.data.src_lang, cfg.data.tgt_lang) == ("de", "en")
    assert [p.name for p in split_files(cfg.data, "valid")] == ["val.de.gz", "val.en.gz"]
    assert cfg == load_config(REPO / "configs" / "tiny.yaml", ["data.src_lang=de"])  # one config, one run


def test_integers_are_read_as_yaml_1_2_reads_them(tmp_path):
    """PyYAML follows YAML 1.1: a leading zero made an octal number and colons a base-60 one, so
    seed: 010 trained with seed 8 and max_epochs: 1:30 ran 90 epochs, without a word (09 was text)."""
    mine = tmp_path / "mine.yaml"
    mine.write_text(f"base: {REPO / 'configs' / 'tiny.yaml'}\ntrain:\n  seed: 010\n  max_epochs: 09\n", encoding="utf-8")
    cfg = load_config(mine, ["data.max_train_pairs=0300", "name=1:30"])
    assert (cfg.train.seed, cfg.train.max_epochs, cfg.data.max_train_pairs, cfg.name) == (10, 9, 300, "1:30")
    assert load_config(mine, ["train.max_epochs=0x10", "train.batch_tokens=1_000"]).train.max_epochs == 16  # as before
    with pytest.raises(ConfigError, match="config key 'train.max_epochs': expected an integer, got '1:30'"):
        load_config(mine, ["train.max_epochs=1:30"])
    with pytest.raises(ConfigError, match="config key 'train.lr': expected a number, got '1:30.5'"):
        load_config(mine, ["train.lr=1:30.5"])
    from cometnmt.config import yaml_dump, yaml_load

    assert yaml_load(yaml_dump({"name": "09", "save_dir": "1:30"})) == {"name": "09", "save_dir": "1:30"}


def test_yaml_1_2_octal_is_a_number():
    """YAML 1.2 writes octal as 0o17; the loader (YAML 1.1's int resolver) read it as text, so
    train.seed: 0o17 was refused ("expected an integer, got '0o17'") and a name '0o17' was written
    to config.yaml unquoted. 0o17 is 15, in files as in --set; the dumper quotes the text."""
    from cometnmt.config import yaml_dump, yaml_load

    assert load_config(REPO / "configs" / "tiny.yaml", ["train.seed=0o17", "name='0o17'"]).train.seed == 15
    assert yaml_load("[0o17, 0o0, 0o8, -0o7, 0o]") == [15, 0, "0o8", "-0o7", "0o"]  # 1.2 has no signed or bare one
    assert yaml_load(yaml_dump({"name": "0o17"})) == {"name": "0o17"}


def test_a_key_that_may_be_null_gets_the_hints_too():
    """The YAML and bracket hints were given for str and list keys but not for those that may also be
    null (the data paths, model.comet.bn_length_bounds): data.multi30k_dir=2024 said only "expected
    str or null, got 2024"."""
    with pytest.raises(ConfigError, match=r"^config key 'data.multi30k_dir': expected str or null, got 2024; YAML reads an "
                                          r"unquoted number as a number: quote the value, e.g. data.multi30k_dir='2024'$"):
        load_config(REPO / "configs" / "tiny.yaml", ["data.multi30k_dir=2024"])
    with pytest.raises(ConfigError, match=r"got False; YAML reads false unquoted as the boolean false: quote it"):
        load_config(REPO / "configs" / "tiny.yaml", ["data.multi30k_dir=false"])
    with pytest.raises(ConfigError, match=r"^config key 'model.comet.bn_length_bounds': expected list of int or null, got "
                                          r"'8,11'; a list is written in brackets: \[8,11\]$"):
        load_config(REPO / "configs" / "tiny.yaml", ["model.comet.bn_length_bounds=8,11"])
    assert load_config(REPO / "configs" / "tiny.yaml", ["data.multi30k_dir='2024'"]).data.multi30k_dir == "2024"


@pytest.mark.parametrize("override, left", [("train.save_dir=runs/exp #3", "'runs/exp'"), ("data.multi30k_dir=#2", "None"),
                                            ("model.comet.features=[8, 4] # two", "[8, 4]")])
def test_a_comment_in_an_override_is_refused(override, left):
    """An override's value is YAML, where ' #' starts a comment: --set 'train.save_dir=runs/exp #3'
    trained into runs/exp and data.multi30k_dir=#2 was null (the default folder), without a word."""
    with pytest.raises(ConfigError, match=rf"^override '{re.escape(override)}': ' #' starts a YAML comment, which would "
                                          rf"leave the value {re.escape(left)}; quote the value"):
        load_config(REPO / "configs" / "tiny.yaml", [override])
    assert load_config(REPO / "configs" / "tiny.yaml", ["train.save_dir='runs/exp #3'", "name=a#b"]).train.save_dir == "runs/exp #3"


def test_a_rule_across_keys_may_be_met_by_a_child_or_an_override(tmp_path):
    """The file's (and each base's) keys were checked alone with the sections' cross-key rules, so
    features of four layers in a file with --set model.comet.dilations=[1,2,3,4] were refused
    ("one dilation ... per layer"), as was a base a child completes."""
    mine = tmp_path / "mine.yaml"
    mine.write_text(f"base: {REPO / 'configs' / 'multi30k' / 'comet.yaml'}\nmodel:\n  comet:\n    features: [64, 32, 16, 8]\n",
                    encoding="utf-8")
    assert load_config(mine, ["model.comet.dilations=[1, 2, 3, 4]"]).model.comet.dilations == [1, 2, 3, 4]
    child = tmp_path / "child.yaml"
    child.write_text("base: mine.yaml\nmodel:\n  comet:\n    dilations: [1, 2, 3, 4]\n", encoding="utf-8")
    assert load_config(child).model.comet.features == [64, 32, 16, 8]
    with pytest.raises(ConfigError, match=r"'model.comet.dilations': one dilation of at least 1 per layer"):
        load_config(mine)  # unmet, it is still refused
    with pytest.raises(ConfigError, match=r"mine.yaml: config key 'model.comet.features\[1\]': expected an integer"):
        mine.write_text("model:\n  comet:\n    features: [64, x]\n", encoding="utf-8")  # a type error still names the file
        load_config(child)


def test_shared_transformer_sizes_are_checked_only_where_read():
    """ConvS2S and the RNN never read model.d_model, n_heads, dropout or the other shared sizes, yet
    a ConvS2S config with model.n_heads: 7 (not dividing d_model) was refused."""
    for arch in ("convs2s", "rnn"):
        cfg = load_config(None, [f"model.arch={arch}", "model.n_heads=7", "model.d_ff=0", "model.dropout=1.0"])
        assert cfg.model.n_heads == 7
    for arch in ("transformer", "comet", "transformer_pp"):
        with pytest.raises(ConfigError, match="'model.n_heads': 7 does not divide"):
            load_config(None, [f"model.arch={arch}", "model.n_heads=7"])
        with pytest.raises(ConfigError, match="'model.d_ff': must be at least 1"):
            load_config(None, [f"model.arch={arch}", "model.d_ff=0"])


def test_max_len_beyond_the_position_table_is_refused_at_load():
    """data.max_len (+2 for <s> </s> with data.src_sos_eos, else +1 for the target BOS) above the
    position table was refused only when training had read (and for Transformer++ tagged) the corpus."""
    with pytest.raises(ConfigError, match=r"'data.max_len' and 'model.max_positions': 64 tokens \(\+1 .*64 positions"):
        load_config(None, ["data.max_len=64", "model.max_positions=64"])
    assert load_config(None, ["data.max_len=63", "model.max_positions=64"]).data.max_len == 63
    with pytest.raises(ConfigError, match=r"'data.max_len' and 'model.max_positions': 63 tokens \(\+2"):
        load_config(None, ["data.max_len=63", "model.max_positions=64", "data.src_sos_eos=true"])
    with pytest.raises(ConfigError, match="'data.max_len' and 'model.convs2s.max_positions'"):
        load_config(None, ["model.arch=convs2s", "data.max_len=64", "model.convs2s.max_positions=64"])
    assert load_config(None, ["model.arch=convs2s", "data.max_len=64", "model.max_positions=8"]).data.max_len == 64
    assert load_config(None, ["model.arch=rnn", "data.max_len=5000"]).data.max_len == 5000


def test_the_readmes_own_corpus_config_loads_as_it_says(tmp_path: Path) -> None:
    """README's config for one's own parallel text (mine.yaml at the repository root, on
    configs/tiny.yaml) reads the files it names, all of them: tiny.yaml's 2,000/100-pair cuts undone."""
    blocks = re.findall(r"^```yaml\n(.*?)^```$", (REPO / "README.md").read_text(encoding="utf-8"), re.S | re.M)
    assert len(blocks) == 1, "README should hold one yaml block, the own-corpus config"
    text = blocks[0].replace("base: configs/", f"base: {REPO / 'configs'}/")  # as from the repository root
    assert text != blocks[0]
    (tmp_path / "mine.yaml").write_text(text, encoding="utf-8")
    cfg = load_config(tmp_path / "mine.yaml")
    assert (cfg.data.corpus, cfg.data.src_lang, cfg.data.tgt_lang) == ("files", "fr", "en")
    assert [cfg.data.train_src, cfg.data.valid_tgt, cfg.data.test_src] == ["data/corpus.fr", "data/dev.en", "data/test.fr"]
    assert cfg.data.max_train_pairs is None and cfg.data.max_valid_pairs is None
    assert cfg.data.min_freq == 1  # tiny.yaml's 3 left ~21% of a 400-pair corpus's source tokens <unk>
    assert cfg.model.d_model == load_config(REPO / "configs" / "tiny.yaml").model.d_model and cfg.train.save_dir == "runs/fr_en"


def test_a_missing_base_says_which_folder_it_is_taken_from(tmp_path: Path, monkeypatch) -> None:
    """README's own-corpus config saved beside one's data (not at the repository root) and trained
    from there said only 'config file not found: configs/tiny.yaml (the base of .../mine.yaml)',
    as if from the current folder; the error now says a base is taken from the config's own folder."""
    (tmp_path / "configs").mkdir()
    child = tmp_path / "mine.yaml"
    child.write_text("base: configs/tiny.yaml\nname: mine\n", encoding="utf-8")
    monkeypatch.chdir(REPO)  # configs/tiny.yaml exists here, not beside mine.yaml
    with pytest.raises(ConfigError, match=rf"^config file not found: .*configs/tiny.yaml \(the base of {re.escape(str(child))}\): "
                                          rf"a relative base: is taken from that file's folder, {re.escape(str(tmp_path))}, "
                                          r"not the current one; give the path from there, or an absolute one$"):
        load_config(child)


@pytest.mark.parametrize("text, got", [("- model:\n    arch: comet\n", "got a list (a YAML line starting with '- ' makes a list)"),
                                       ("comet\n", "got a single value"), ("3\n", "got a number")])
def test_a_file_that_is_not_a_mapping_says_what_it_is(tmp_path, text, got):
    """A config whose top level is no mapping said "the top level must be a mapping of sections",
    not what it found (configorder's walk): a list from a stray '- ' is the usual slip."""
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: the top level must be a mapping of sections "
                                          rf"\(model:, data:, train:, \.\.\.\), {re.escape(got)}$"):
        load_config(path)
