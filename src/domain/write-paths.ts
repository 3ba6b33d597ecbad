// Pure domain logic; filled in by its issue.
export {};
