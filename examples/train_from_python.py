"""Train SRPO from Python: the shipped column model, the settings tested for its class, 4 iterations."""

from learners import TrainConfig, Trainer, settings_for

model = "agents/checkpoints/mini-columns-sft"
_, tiny = settings_for(model)  # the settings `srpo train` gives this model's class (learners.profiles)
cfg = TrainConfig(
    algo="srpo",
    model=model,
    env_id="ProcArith-v0",
    env_kwargs={"workflow": "routed", "dataset": "procedural-columns"},
    out_dir="runs/python",
    iterations=4,
    **tiny,
)
trainer = Trainer(cfg, log=None)
start = trainer.evaluate()  # held-out accuracy (cfg.eval_problems tasks x cfg.eval_k samples)
for it in range(1, cfg.iterations + 1):
    batch = trainer.rollout(it)  # tasks_per_iter x group_size episodes, complete events only
    stats = trainer.update(batch, it)  # advantages, minibatches, optimizer steps
    print(f"iteration {it}: train accuracy {batch.accuracy:.2f}, approx-KL {stats['actor/approx_kl']:.4f}")
end = trainer.evaluate()
print(f"held-out accuracy {start:.3f} -> {end:.3f}")
trainer.export("runs/python/final")  # save_pretrained: load it with transformers or `srpo bench eval`
