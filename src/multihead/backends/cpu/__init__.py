"""The C++ decode kernel: its build for this CPU's ISA, its checked calls, its choice table and its sources."""
