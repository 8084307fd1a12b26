"""SGLang plugin: ``--pp-mode {cpp,dcpp,vpp,vpp-async,vpp-pack,vpp-taper,vpp-stream}`` on ``sglang.launch_server``.

The only package of the project that imports ``sglang`` (pinned to 0.5.23, ``version.py``).
Nothing of SGLang is copied: every change is a hook registered with SGLang's HookRegistry.

Data flow::

    launcher:   load_plugins() -> entry.register()               (entry point sglang.srt.plugins)
                ServerArgs.add_cli_args  [AFTER]  cli_args: flags + parse-time validation
                ServerArgs.from_cli_args [AROUND] cli_args: dcpp switch, options on
                                                  server_args._sglang_vpp (options.py)
    scheduler:  (spawned, server_args unpickled with the options)
                runtime_context.publish(role="scheduler") [BEFORE] process_hooks:
                    cpu_compat.register_cpu_hooks()   generic CPU platform only
                    vpp.install(server_args)          vpp* modes only
                    HookRegistry.apply_hooks()
    any process: import torch -> torch_autoload.autoload()       (entry point torch.backends)

Modules: ``entry`` (registration), ``options`` (PipelineOptions, how they travel), ``cli_args``
(flags), ``validate`` (refusals), ``process_hooks`` (scheduler set-up), ``surface`` (every
SGLang name the project touches, declared, and the start-up check), ``hook_targets``
(registering hooks and the checks that they took), ``input_guard`` (bad
prompts -> 400), ``failure_report`` (which rank failed; fast exit on CPU), ``rank_exit``
(a scheduler whose loop raised exits with code 0 before native teardown),
``stock_loop_watchdog`` (--vpp-comm-timeout for cpp/dcpp), ``cpu_compat`` (rotary embedding
without vllm), ``torch_autoload``
(CUDA torchvision on CPU torch), ``errors``, ``version``. The ``vpp/`` subpackage implements
the fold-back pipeline itself. Documentation: docs/sglang-plugin.md, docs/sglang-cpu.md.

Importing this package imports neither sglang nor torch.
"""
