# The code bases under tasks/suite/*/base are task material, not this
# project's tests: their own test suites run only inside their repositories.
collect_ignore_glob = ["*/base/*", "*/history/*", "*/tasks/*"]
