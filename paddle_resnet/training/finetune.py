"""Fine-tuning controls over a model family's stages (``ModelFamily.stages``, the stem
first): --frozen-stages freezes a prefix of them, weights and batch-norm statistics,
and --lr-mult-list scales each stage's learning rate (PaddleClas' ``lr_mult_list``).

Both are applied to the training model before its forward pass: a frozen stage's batch
norms run on their running statistics, and its parameters get no gradient, so the
optimizer neither moves nor decays them."""

from paddle_resnet.core.errors import ConfigError


def check(finetune_config, family, arch):
    """ConfigError unless the settings fit ``family``'s stages."""
    stages = len(family.stages)
    if finetune_config.frozen_stages >= 0 and not stages:
        raise ConfigError(f"--frozen-stages: {arch} declares no stages to freeze")
    if finetune_config.frozen_stages > stages - 1:
        raise ConfigError(
            f"finetune.frozen_stages (--frozen-stages) is at most {stages - 1} for {arch} "
            f"(the stem and {stages - 1} stages), got {finetune_config.frozen_stages}"
        )
    multipliers = finetune_config.lr_mult_list
    if multipliers and len(multipliers) != stages:
        raise ConfigError(
            f"finetune.lr_mult_list (--lr-mult-list) takes {stages} values for {arch} (the "
            f"stem and each stage), got {len(multipliers)}"
        )


def _stage_layers(model, family):
    """(stage index, layer) of every layer ``family.stages`` names in ``model``."""
    layers = dict(model.named_sublayers())
    for index, paths in enumerate(family.stages):
        for path in paths:
            yield index, layers[path]


def apply(model, family, finetune_config):
    """Freeze and scale ``model``'s stages as ``finetune_config`` says (a built training
    model, before it is called)."""
    multipliers = finetune_config.lr_mult_list
    for index, layer in _stage_layers(model, family):
        if index <= finetune_config.frozen_stages:
            layer.eval()
            for param in layer.parameters():
                param.stop_gradient = True
        elif multipliers:
            for param in layer.parameters():
                param.optimize_attr["learning_rate"] = multipliers[index]


def frozen_parameters(model, family, finetune_config):
    """The parameter names of the frozen stages."""
    return [
        param.name
        for index, layer in _stage_layers(model, family)
        if index <= finetune_config.frozen_stages
        for param in layer.parameters()
    ]
