"""Devices: profiles, calibration, latency models and emulation.

profile.py        the profile schema; load_profile(name or path), load_all()
profiles/*.toml   one sourced profile per device (Apple M1-M4, A17 Pro, Snapdragon 8 Gen 3,
                  Jetson AGX Orin, Raspberry Pi 5, cloud A800/H800/V100)
model_sizes.py    bytes and FLOPs of public model configs (qwen3-8b, llama-3.1-8b, ...)
latency.py        FlexSpec eq. (7)-(11), Mirror-SD eq. (10)/(14) and App. C, CU-HLM eq. (5)-(6),
                  roofline; pure functions
links.py          named link conditions 5g / 4g / wifi-weak and block fading
fit.py            least squares with R²
calibrate.py      measure this machine with the real backends
method_choice.py  `--method auto`: ar / sd / mirror tokens/s from stage times, the fastest
pair_probe.py     `--method auto` on the pair at hand: measure, then choose
pair_trials.py    auto's trial runs: sd and mirror once each, their rates correct the laws
pair_stages.py    the stage times and contention auto needs, measured on the pair
pair_passes.py    the passes pair_stages.py times, built as their methods run them
pair_laws.py      the acceptance laws auto predicts with: α, τ per γ, Ω̂
probe_memo.py     what the probe measured in this process (probe_store.py keeps it)
probe_export.py   probe_memo's tables as JSON entries and back, for probe_store.py
emulation.py      Emulator: pad real stages to a profile's predicted times
emulated_model.py wrap a loaded model so every pass runs inside an emulated stage
__main__.py       python -m devices list | show | calibrate | latency
"""
