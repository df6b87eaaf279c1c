"""sao: the application. The `sao` command line, the assembled run config, `sao serve`, the demo."""
