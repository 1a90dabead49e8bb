package main

import (
	"debug/elf"
	"debug/gosym"
	"errors"
	"fmt"
)

// funcOffsets returns the file offsets of the entries of the Go functions
// named (full names, "pkg/path.(*T).M"), as uprobes want them, for those
// the executable at path has. It reads the ELF symbol table, and where
// there is none (a binary linked with -s, as go run and go test link
// theirs) the Go runtime's own function table, .gopclntab, which every Go
// binary keeps.
func funcOffsets(path string, names []string) (map[string]uint64, error) {
	f, err := elf.Open(path)
	var fe *elf.FormatError
	if errors.As(err, &fe) {
		return nil, fmt.Errorf("%w: %s is not an ELF executable (%v)", errNoSymbols, path, err)
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	vaddrs := map[string]uint64{}
	syms, err := f.Symbols()
	switch {
	case err == nil:
		for _, s := range syms {
			if want[s.Name] && elf.ST_TYPE(s.Info) == elf.STT_FUNC && s.Value != 0 {
				vaddrs[s.Name] = s.Value
			}
		}
	case !errors.Is(err, elf.ErrNoSymbols):
		return nil, fmt.Errorf("%s: symbols: %w", path, err)
	}
	if len(vaddrs) < len(want) {
		if err := pclntabFuncs(f, want, vaddrs); err != nil && (len(vaddrs) == 0 || !errors.Is(err, errNoSymbols)) {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	offs := make(map[string]uint64, len(vaddrs))
	for name, va := range vaddrs {
		for _, p := range f.Progs {
			if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 && p.Vaddr <= va && va < p.Vaddr+p.Memsz {
				offs[name] = va - p.Vaddr + p.Off
				break
			}
		}
	}
	return offs, nil
}

// pclntabFuncs adds the entries of the wanted functions that the Go
// function table of f lists to vaddrs.
func pclntabFuncs(f *elf.File, want map[string]bool, vaddrs map[string]uint64) error {
	var tab *elf.Section
	for _, name := range []string{".gopclntab", ".data.rel.ro.gopclntab"} {
		if tab = f.Section(name); tab != nil {
			break
		}
	}
	text := f.Section(".text")
	if tab == nil || text == nil {
		return fmt.Errorf("%w: no symbol table and no Go function table (.gopclntab)", errNoSymbols)
	}
	data, err := tab.Data()
	if err != nil {
		return fmt.Errorf("read .gopclntab: %w", err)
	}
	t, err := gosym.NewTable(nil, gosym.NewLineTable(data, text.Addr))
	if err != nil {
		return fmt.Errorf("parse .gopclntab: %w", err)
	}
	for _, fn := range t.Funcs {
		if want[fn.Name] && vaddrs[fn.Name] == 0 {
			vaddrs[fn.Name] = fn.Entry
		}
	}
	return nil
}
