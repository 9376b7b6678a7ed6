"""The ground floor every other folder stands on: the process environment (bootstrap),
one-line errors, the read-only Config and each tool's command line, crash-safe files,
JSON-lines reports, metrics, optional packages, every private Paddle API, the device and
CPU probes (and the preflight findings the doctor reports), and the stuck-rank watchdog."""
