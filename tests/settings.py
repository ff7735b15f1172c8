"""Training settings that tests in more than one folder share (importable as ``settings``)."""

# distrl's quick CartPole setting for tests: the zoo's (CartPole-v1 preset) on a 64x64 network with 4x shorter phases
FAST_CARTPOLE = dict(
    learning_rate=2.3e-3,
    batch_size=64,
    buffer_size=50_000,
    learning_starts=1000,
    target_update_interval=10,
    train_freq=64,
    gradient_steps=32,
    exploration_fraction=0.16,
    exploration_final_eps=0.04,
    net_arch=(64, 64),
)
