rule train:
    input:
        model=model_dir,
        prepared="prepared/{recipe}",
        plan="plans/{recipe}/plan.json",
        env=backend_env,
        upstream=upstream_checkpoint,
    output:
        directory("checkpoints/{recipe}"),
    log:
        "logs/{recipe}/train.log",
    benchmark:
        "benchmarks/{recipe}/train.tsv"
    conda:
        train_env
    container:
        train_container
    threads: workflow.cores
    resources:
        mem_mb=planned("mem_mb", 4096),
        runtime=planned("runtime", 60),
        gpu=planned("gpus", 0),
        cpus_per_task=planned("cpus", 2),
        nodes=planned("nodes", 1),
    params:
        recipe=recipe_slice("train"),
        reward_files=reward_file_hashes,
        work_dir="runs/{recipe}",
    script:
        "../scripts/dispatch.py"
