"""
Tests for configurator.py (config files and --key=value flags over a script's globals, --help) and for common.py's
one-line errors, progress lines and W&B run ids.

    python -m pytest -q tests/test_configurator.py
"""
import json
import os
import re
import subprocess
import sys

import pytest

from common import UserError, write_json
import configurator
from configurator import configure, print_config
from tests.toyrun import script_defaults


def script_globals():
    """What a train.py module namespace looks like when it calls configure()."""
    return dict(
        __name__='__main__', _private_helper=3, os=os, helper=lambda x: x,  # never config keys
        learning_rate=2e-5, batch_size=32, compile=False, out_dir='out', init_from=None,
        betas=(0.9, 0.999), eval_datasets=['A', 'B'], extra={'a': 1},
    )


def write(tmp_path, text, name='override.py'):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_keys_are_public_plain_values_and_globals_update_in_place():
    namespace = script_globals()
    config = configure(namespace, ['--batch_size=8'])
    assert list(config) == ['learning_rate', 'batch_size', 'compile', 'out_dir', 'init_from',
                            'betas', 'eval_datasets', 'extra']
    assert namespace['batch_size'] == 8 and config['batch_size'] == 8


def test_every_call_starts_from_the_scripts_defaults_and_constants_are_no_keys():
    namespace = dict(script_globals(), SCORE_KEYS=("a",), IMAGE_MARKER="<|image_1|>")
    assert configure(namespace, ['--batch_size=8'])['batch_size'] == 8
    config = configure(namespace, [])  # main() run twice in one process: the first run's values do not leak
    assert config['batch_size'] == 32 == namespace['batch_size'] and 'SCORE_KEYS' not in config
    with pytest.raises(UserError, match="unknown config key 'SCORE_KEYS'"):
        configure(namespace, ['--SCORE_KEYS=()'])


def test_bare_arguments_are_config_files_or_a_scripts_paths(tmp_path):
    path = write(tmp_path, 'batch_size = 16\n')
    namespace = dict(script_globals(), paths=[])
    config = configure(namespace, ['out/run1', path, 'out/run2'], positional='paths')
    assert config['paths'] == ['out/run1', 'out/run2'] and config['batch_size'] == 16
    with pytest.raises(UserError, match=r"out/run1: no such config file"):
        configure(script_globals(), ['out/run1'])  # a script that takes no paths


def test_unknown_key_in_file_names_file_and_key(tmp_path):
    path = write(tmp_path, 'learning_rat = 1e-5\n')
    with pytest.raises(UserError, match=r"override\.py.*'learning_rat'.*learning_rate"):
        configure(script_globals(), [path])


def test_file_may_import_and_use_private_names(tmp_path):
    path = write(tmp_path, 'import math\n_base = 4\nbatch_size = int(math.sqrt(_base)) * 16\n')
    assert configure(script_globals(), [path])['batch_size'] == 32


def test_unknown_key_on_command_line_suggests_close_match():
    with pytest.raises(UserError, match=r"'learning_rat'.*did you mean learning_rate"):
        configure(script_globals(), ['--learning_rat=1e-5'])


def test_the_forms_people_type_are_accepted():
    assert configure(script_globals(), ['--compile'])['compile'] is True  # a bare boolean flag
    assert configure(script_globals(), ['--compile', 'false', '--batch_size', '8']) == \
        configure(script_globals(), ['--compile=False', '--batch_size=8'])
    for text, value in (('true', True), ('TRUE', True), ('False', False), ('false', False)):
        assert configure(script_globals(), [f'--compile={text}'])['compile'] is value
    with pytest.raises(UserError, match=r'--batch_size: expected a value: --batch_size=VALUE or --batch_size VALUE'):
        configure(script_globals(), ['--batch_size'])
    with pytest.raises(UserError, match=r'--batch_size: expected a value'):
        configure(script_globals(), ['--batch_size', '--compile'])
    with pytest.raises(UserError, match=r"unknown config key 'lr'; did you mean learning_rate\?"):
        configure(script_globals(), ['--lr=1e-5'])
    with pytest.raises(UserError, match=r"unknown config key 'lr'"):
        configure(script_globals(), ['--lr', '1e-5'])


def test_wrong_type_names_key_and_types_with_an_example():
    with pytest.raises(UserError, match=r"batch_size expects int, e\.g\. --batch_size=32 \(default 32\), got str"):
        configure(script_globals(), ["--batch_size='8'"])
    with pytest.raises(UserError, match=r"'eight' is not a value of its type: batch_size expects int, e\.g\. --batch_size=32"):
        configure(script_globals(), ['--batch_size=eight'])
    with pytest.raises(UserError, match=r"compile expects bool, e\.g\. --compile=True or False"):
        configure(script_globals(), ['--compile=yes'])


def test_wrong_type_in_file_names_the_file(tmp_path):
    path = write(tmp_path, 'compile = "yes"\n')
    with pytest.raises(UserError, match=r"override\.py.*compile expects bool.*got str"):
        configure(script_globals(), [path])


def test_int_accepted_for_float_and_converted():
    config = configure(script_globals(), ['--learning_rate=1'])
    assert config['learning_rate'] == 1.0 and type(config['learning_rate']) is float


def test_bool_rejected_for_int_and_float_and_int_for_bool():
    for flag in ['--batch_size=True', '--learning_rate=False', '--compile=1']:
        with pytest.raises(UserError):
            configure(script_globals(), [flag])


def test_only_first_equals_splits():
    assert configure(script_globals(), ['--out_dir=a=b'])['out_dir'] == 'a=b'


def test_string_without_quotes_and_numeric_looking_string():
    config = configure(script_globals(), ['--out_dir=out/run1'])
    assert config['out_dir'] == 'out/run1'
    assert configure(script_globals(), ['--out_dir=2024'])['out_dir'] == '2024'
    assert configure(script_globals(), ["--out_dir='quoted'"])['out_dir'] == 'quoted'


def test_none_default_accepts_literal_or_raw_text():
    assert configure(script_globals(), ['--init_from=3'])['init_from'] == 3
    assert configure(script_globals(), ['--init_from=out/stage1/step2000'])['init_from'] == 'out/stage1/step2000'


def test_list_and_tuple_values_keep_the_default_type():
    config = configure(script_globals(), ["--eval_datasets=['C', 'D', 'E']", '--betas=[0.8,0.9]'])
    assert config['eval_datasets'] == ['C', 'D', 'E']
    assert config['betas'] == (0.8, 0.9)
    with pytest.raises(UserError, match=r"--betas=7: betas expects tuple, e\.g\. --betas=\(0\.9,0\.999\) "):
        configure(script_globals(), ['--betas=7'])  # a fixed-length tuple: its example is its default


def test_one_bare_value_of_an_empty_tuple_key_is_a_one_item_tuple(tmp_path):  # --matryoshka_dims=16
    assert configure(dict(script_globals(), dims=()), ['--dims=16'])['dims'] == (16,)
    assert configure(dict(script_globals(), dims=()), ['--dims=[16, 32]'])['dims'] == (16, 32)
    with pytest.raises(UserError, match=r"dims expects tuple, e\.g\. --dims=\(16, 32\) \(default \(\)\), got int"):
        configure(dict(script_globals(), dims=()), [write(tmp_path, 'dims = 16\n')])  # a file says what it means


def test_one_bare_value_of_a_list_key_is_a_one_item_list():
    assert configure(script_globals(), ['--eval_datasets=data/shapes/train.jsonl'])['eval_datasets'] == \
        ['data/shapes/train.jsonl']
    assert configure(script_globals(), ['--eval_datasets=Shapes-CLS'])['eval_datasets'] == ['Shapes-CLS']
    assert configure(script_globals(), ["--eval_datasets='quoted'"])['eval_datasets'] == ['quoted']
    assert configure(script_globals(), ["--eval_datasets={'path': 'x'}"])['eval_datasets'] == [{'path': 'x'}]
    assert configure(script_globals(), ['--eval_datasets=7'])['eval_datasets'] == [7]


def test_chosen_names_the_keys_a_file_or_flag_set_even_to_their_default(tmp_path):
    namespace = script_globals()
    configure(namespace, [write(tmp_path, 'batch_size = 32\n'), '--compile=True'])
    assert configurator.chosen(namespace) == {'batch_size', 'compile'}  # 32 is the default: set all the same
    configure(namespace, [])
    assert configurator.chosen(namespace) == set()


def test_arguments_apply_left_to_right(tmp_path):
    path = write(tmp_path, 'batch_size = 16\nlearning_rate = 2e-6\n')
    config = configure(script_globals(), [path, '--batch_size=4'])
    assert config['batch_size'] == 4 and config['learning_rate'] == 2e-6
    config = configure(script_globals(), ['--batch_size=4', path])
    assert config['batch_size'] == 16


def test_config_round_trips_through_json(tmp_path, capsys):
    config = configure(script_globals(), ['--betas=(0.5, 0.6)', '--out_dir=out/run1'])
    path = str(tmp_path / 'config.json')
    write_json(path, config)
    loaded = json.load(open(path))
    assert loaded == {**config, 'betas': [0.5, 0.6]}  # JSON has no tuples
    assert configure(script_globals(), [f'--{key}={value!r}' for key, value in loaded.items()]) == config
    print_config(config)
    assert "out_dir       = 'out/run1'" in capsys.readouterr().out


# -----------------------------------------------------------------------------
# the repository's own configs and scripts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


TOY_PATHS = ['--init_from=data/shapes/tiny-qwen3.5', "--train_data=['data/shapes/train.jsonl']",
             '--image_dir=data/shapes/images']
TRAIN_CONFIGS = sorted(name for name in os.listdir(os.path.join(ROOT, 'config')) if name != 'shapes_eval.py')


@pytest.fixture(scope='module')
def train_defaults():
    return script_defaults('train.py')


def test_help_prints_every_key_its_default_and_comment(capsys):
    import eval as evaluation
    from shapes import prepare, spread
    from tools import plot, search
    helps = {}
    for main, command, line in ((evaluation.main, "python eval.py", r"^batch_size += 16  # items per forward pass$"),
                                (search.main, "python -m tools.search", r"^top_k += 5  # results per query"),
                                (plot.main, "python -m tools.plot", r"^paths += \[\]"),
                                (prepare.main, "python -m shapes.prepare", r"^num_train += 2000"),
                                (spread.main, "python -m shapes.spread", r"^seeds += \[1337, 1338, 1339\]  # train")):
        with pytest.raises(SystemExit) as done:
            main(["--help"])
        out = helps[command] = capsys.readouterr().out
        assert done.value.code == 0 and re.search(line, out, re.M), out[-1000:]
        assert f"usage: {command} " in out  # as the script is run (a folder's with -m)
    evaluation_help = helps["python eval.py"]
    assert evaluation_help.startswith("eval.py: MMEB Precision@1")  # the docstring's start: what it is, how to run it
    assert re.search(r"^datasets += \[\]  # dataset folder names to score", evaluation_help, re.M)


HELP_OF_EACH = """
import contextlib, io, json, runpy, sys, traceback
said = {}
for name in sys.argv[1:]:  # each as python -m name --help runs it, in this one process: torch is imported once
    stdout, stderr, code = io.StringIO(), io.StringIO(), None
    sys.argv = [name, "--help"]
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        except SystemExit as exit:
            code = exit.code or 0
        except BaseException:
            traceback.print_exc()
    said[name] = [code, stdout.getvalue(), stderr.getvalue()]
print(json.dumps(said))
"""


@pytest.mark.slow
def test_every_module_of_the_folders_scripts_answers_help_without_a_traceback():
    # a script prints its keys; a library module (the judge, the tiny model, the bench's helpers) says what it is and
    # what runs it; the mteb wrapper needs mteb only to run, not to say how
    modules = [f'{folder}.{name[:-3]}' for folder in ('tools', 'shapes', 'bench')
               for name in sorted(os.listdir(os.path.join(ROOT, folder))) if name.endswith('.py') and name != '__init__.py']
    assert {'tools.judge', 'tools.mteb_model', 'shapes.tiny_model', 'bench.startup'} < set(modules)
    run = subprocess.run([sys.executable, '-c', HELP_OF_EACH, *modules], cwd=ROOT, capture_output=True, text=True,
                         timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    said = json.loads(run.stdout.strip().splitlines()[-1])
    assert list(said) == modules
    for name, (code, stdout, stderr) in said.items():
        assert code == 0 and 'Traceback' not in stderr, (name, code, stderr[-2000:])
        assert stdout.startswith(f'{name.replace(".", "/")}.py: ') or name in ('shapes.prepare', 'shapes.spread',
                                                                             'shapes.study'), (name, stdout[:200])
        script = 'tools.mine' if name == 'tools.judge' else name
        assert f'python -m {script}' in stdout or name.startswith(('shapes.', 'bench.')) and 'python' in stdout, name


@pytest.mark.parametrize('name', TRAIN_CONFIGS)
def test_every_training_config_resolves_and_its_stage_two_starts_from_a_kept_checkpoint(name, train_defaults):
    defaults = train_defaults
    config = configure(dict(defaults), [os.path.join(ROOT, 'config', name)])
    assert config['similarity'] in ('cos', 'dot') and config['weighting'] in ('focal', 'random', 'query_positive',
                                                                             'query_negative')
    assert config['temperature'] == {'cos': 0.1, 'dot': 100.0}[config['similarity']] / (5 if config['grad_cache_chunk'] else 1) \
        or name.startswith('shapes_') or (name == 'unime_v2.py' and config['temperature'] == 0.02 == config['judge_temperature']) \
        or (config['objective'] == 'rerank' and config['temperature'] == 1.0)
    # Table 3, and Table 6's tau / 5 with GradCache; UniME-V2's released loss takes its own 0.02; a reranker's
    # scores are log-odds (tau_r = 1) and its LoRA learns at 1e-4 (rerank.py)
    assert config['learning_rate'] == (2e-5 if config['lora_rank'] else 2e-6) or name.startswith('shapes_') \
        or (config['objective'] == 'rerank' and config['learning_rate'] == 1e-4)
    assert config['batch_size'] % 8 == 0  # splits over 8 GPUs
    configure(dict(defaults), [os.path.join(ROOT, 'config', name)] + TOY_PATHS)  # and with the toy's paths
    stage_one = os.path.basename(config['init_from'])
    if stage_one.startswith('step_'):  # a Stage II: the Stage I config that writes its init_from keeps that step
        out_dir, step = os.path.dirname(config['init_from']), int(stage_one[len('step_'):])
        writers = [other for other in TRAIN_CONFIGS
                   if configure(dict(defaults), [os.path.join(ROOT, 'config', other)])['out_dir'] == out_dir]
        assert len(writers) == 1, (name, out_dir)
        writer = configure(dict(defaults), [os.path.join(ROOT, 'config', writers[0])])
        assert step in writer['keep_checkpoints'] and step <= writer['max_iters'], (name, writers[0])


def test_the_eval_config_resolves():
    config = configure(dict(script_defaults('eval.py')), [os.path.join(ROOT, 'config', 'shapes_eval.py')])
    assert config['init_from'] == 'out/shapes_stage2/export' and config['instructions'] == 'paper'


@pytest.mark.slow
@pytest.mark.parametrize('script,args,message', [
    ('train.py', ['--learning_rat=1'], "error: --learning_rat=1: unknown config key 'learning_rat'; did you mean "
                                       "learning_rate?"),
    ('eval.py', ['--init_from=/no/such/folder', '--mmeb_dir={mmeb}'], "error: '/no/such/folder' does not exist"),
    ('train.py', ["--objective='rerank'", '--num_hard_negatives=0'], "error: objective='rerank' learns from each row's "
                                                                     "positive against its negatives"),
    ('train.py', ['--init_from=models/Qwen3.5-08B-Base', '--train_data={rows}', '--check_data=False',
                  '--batch_size=1', '--num_hard_negatives=0'], "error: 'models/Qwen3.5-08B-Base' does not exist (or is not a folder): expected a "
                                     "Hugging Face folder"),
])
def test_a_mistake_ends_in_one_line_without_a_traceback(script, args, message, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    (tmp_path / 'mmeb' / 'Mine').mkdir(parents=True)  # an evaluation folder with one dataset
    pq.write_table(pa.table({'qry_text': ['q'], 'qry_img_path': [''], 'tgt_text': [['a', 'b']],
                             'tgt_img_path': [['', '']]}), tmp_path / 'mmeb' / 'Mine' / 'test.parquet')
    (tmp_path / 'rows.jsonl').write_text('{"query": "a query", "positive": "its positive"}\n')  # plain layout
    args = [a.replace('{mmeb}', str(tmp_path / 'mmeb')).replace('{rows}', str(tmp_path / 'rows.jsonl')) for a in args]
    # a start that fails writes nothing: no out_dir (out/typo/), no config.json in it. Run from another folder than
    # the project's root, a relative path's error says where it was read from
    out = tmp_path / 'out' / 'typo'
    run = subprocess.run([sys.executable, os.path.join(ROOT, script), f'--out_dir={out}' if script == 'train.py'
                          else f'--out={tmp_path}/e.json', *args], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and 'Traceback' not in run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith(message), run.stderr[-2000:]
    assert not out.exists()
    if 'Qwen3.5-08B' in message:
        assert f"read from the working directory, {tmp_path}, not the project's root {ROOT})" in run.stderr


def test_a_bug_keeps_its_traceback_and_a_mistake_does_not():
    from common import one_line_message
    try:
        json.loads('{')  # raised inside the standard library
    except ValueError as error:
        assert one_line_message(error) is None
    try:
        configure(script_globals(), ['--nope=1'])
    except UserError as error:
        assert "unknown config key 'nope'" in one_line_message(error)
    # an AttributeError raised in this repository's own code (an edited script's bug) keeps its file and line
    code = "import common, configurator; common.install_error_hook(); configurator.configure(None, [])"
    run = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and 'Traceback' in run.stderr and 'configurator.py' in run.stderr
    assert 'AttributeError' in run.stderr and not run.stderr.startswith('error:')


def test_the_wandb_run_id_survives_a_resume_and_not_a_fresh_start(tmp_path):
    from runs.outdir import wandb_run_id
    first = wandb_run_id(str(tmp_path), resuming=False)
    assert (tmp_path / 'wandb_run_id').read_text().strip() == first
    assert wandb_run_id(str(tmp_path), resuming=True) == first  # --resume=True continues the same W&B run
    fresh = wandb_run_id(str(tmp_path), resuming=False)
    assert fresh != first and wandb_run_id(str(tmp_path), resuming=True) == fresh
    (tmp_path / 'new').mkdir()  # resuming a run that never logged to W&B: a new id, kept from now on
    assert wandb_run_id(str(tmp_path / 'new'), resuming=True) == (tmp_path / 'new' / 'wandb_run_id').read_text().strip()


def test_progress_says_done_rate_and_time_left(capsys, monkeypatch):
    from common import Progress, duration
    clock = iter([0.0, 0.0, 40.0, 80.0])
    monkeypatch.setattr('common.time.time', lambda: next(clock))
    progress = Progress(100, 'encoding', every=10.0)
    progress.update(25)  # 40 s in: 25 items, 0.6/s, 75 left -> 2:00
    progress.update(75)  # done
    lines = capsys.readouterr().out.splitlines()
    assert lines == ['encoding: 25/100 items, 0.6/s, 0:40 elapsed, ~2:00 left', 'encoding: 100/100 items, 1.2/s, 1:20 elapsed']
    assert duration(3725) == '1:02:05' and duration(65) == '1:05'


def test_atomic_writes_use_a_temporary_name_of_their_own_and_say_when_they_replace_a_newer_file(tmp_path, capsys):
    from common import replaced_atomically, write_text
    path = str(tmp_path / 'out.json')
    with replaced_atomically(path) as first, replaced_atomically(path) as second:  # two writers of one output
        assert first != second and os.path.dirname(first) == str(tmp_path)
        open(first, 'w').write('first')
        open(second, 'w').write('second')
    assert open(path).read() == 'first' and sorted(os.listdir(tmp_path)) == ['out.json']  # whole, no temporary left
    started = os.path.getmtime(path) - 10  # a writer that started before the file above was written
    write_text(path, 'later', since=started)
    assert f"note: replaced {path}, which another writer wrote after this one started" in capsys.readouterr().out
    write_text(path, 'again', since=os.path.getmtime(path) + 10)
    assert capsys.readouterr().out == '' and open(path).read() == 'again'
    with pytest.raises(ZeroDivisionError):
        with replaced_atomically(path) as tmp:
            open(tmp, 'w').write('half')
            1 / 0
    assert open(path).read() == 'again' and sorted(os.listdir(tmp_path)) == ['out.json']  # a failed write leaves no trace
