"""The README, recipes and launch scripts stay in step with the code."""
import glob
import os
import re
import subprocess

from conftest import ROOT
from paddle_resnet.config import FLAGS, INFERENCE_FLAGS, list_recipes


def test_readme_documents_every_flag():
    with open(os.path.join(ROOT, "README.md")) as handle:
        readme = handle.read()
    for flags in list(FLAGS.values()) + list(INFERENCE_FLAGS.values()):
        for flag, dotted, _ in flags:
            assert f"`{flag}`" in readme and f"`{dotted}`" in readme, flag


def test_shell_scripts_parse_and_name_real_recipes():
    scripts = glob.glob(os.path.join(ROOT, "scripts", "**", "*.sh"), recursive=True)
    assert len(scripts) > 20
    recipes = set(list_recipes())
    for script in scripts + [os.path.join(ROOT, ".ci", "run")]:
        subprocess.run(["bash", "-n", script], check=True)
        with open(script) as handle:
            text = handle.read()
        for name in re.findall(r'launch\.sh" (\S+) ', text):
            assert name in recipes, (script, name)


def test_launch_script_rejects_bad_arguments():
    launch = os.path.join(ROOT, "scripts", "training", "launch.sh")
    result = subprocess.run(["bash", launch, "resnet50_paddle_90e", "8", "FP8"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "PRECISION must be AMP or TF32" in result.stderr
