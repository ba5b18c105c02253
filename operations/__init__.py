"""Step functions: each module is one frozen *Config dataclass plus one fn(config).

Operations never import the executor; they read inputs from paths in their config and
write under `config.output_path`, so they run the same from a test or from a step.
"""
