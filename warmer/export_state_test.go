package warmer

// MaxOneOffMembers exposes the per-declaration bound on one-off state to tests.
const MaxOneOffMembers = maxOneOffMembers
