"""Helpers shared by tests (not tests themselves): fakes, generated task repos, data builders."""
