package main

// The BPF program is C (bpf/sdtrace.c), compiled by bpf2go into the
// committed sdtrace_x86_bpfel.{go,o}, so that building needs no clang.
// scripts/bpfgen.sh installs clang, llvm and libbpf-dev and runs this.
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go@v0.22.0 -target amd64 -cc clang -type event -cflags "-O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu" sdtrace bpf/sdtrace.c
