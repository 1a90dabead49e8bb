// Command vminit is the /init of the initramfs that scripts/vmtest.sh boots
// under qemu, and the tool that packs that initramfs.
//
// As process 1 it mounts proc, sysfs, devtmpfs, tracefs, bpffs and a tmpfs
// on /tmp, runs every /tests/*.test binary with -test.v and the arguments in
// /tests/args (one a line), prints one "VMTEST: <binary> exit=<code>" line
// each and a final "VMTEST-RESULT: PASS" or "VMTEST-RESULT: FAIL exit=<code>"
// line on the console, and powers the machine off. Kernel command-line
// words of the form NAME=value reach it, and the tests, as environment.
//
// Run otherwise, "vminit pack OUT DIR" writes DIR as a newc cpio archive
// (what the kernel unpacks as initramfs) to OUT, so that no cpio tool is
// needed.
//
// It uses only the standard library: it is built with CGO_ENABLED=0 and
// runs alone on a bare kernel.
package main

import (
	"bufio"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

func main() {
	if os.Getpid() != 1 {
		if err := run(os.Stdout, os.Args[1:]); err != nil {
			fmt.Fprintln(os.Stderr, "vminit:", err)
			os.Exit(1)
		}
		return
	}
	code := initMain()
	if code == 0 {
		fmt.Println("VMTEST-RESULT: PASS")
	} else {
		fmt.Printf("VMTEST-RESULT: FAIL exit=%d\n", code)
	}
	syscall.Sync()
	// LINUX_REBOOT_CMD_POWER_OFF; qemu exits with -no-reboot.
	syscall.Reboot(syscall.LINUX_REBOOT_CMD_POWER_OFF)
	select {}
}

func run(stdout io.Writer, args []string) error {
	if len(args) != 3 || args[0] != "pack" {
		return fmt.Errorf("usage: vminit pack OUT.cpio DIR (as process 1 it is an init)")
	}
	return pack(args[1], args[2])
}

// initMain sets the machine up, runs the tests and returns the first
// non-zero exit code.
func initMain() int {
	mounts := []struct{ src, dir, fstype string }{
		{"proc", "/proc", "proc"},
		{"sysfs", "/sys", "sysfs"},
		{"devtmpfs", "/dev", "devtmpfs"},
		{"tmpfs", "/tmp", "tmpfs"},
		{"tracefs", "/sys/kernel/tracing", "tracefs"},
		{"bpffs", "/sys/fs/bpf", "bpf"},
	}
	for _, m := range mounts {
		os.MkdirAll(m.dir, 0o755)
		if err := syscall.Mount(m.src, m.dir, m.fstype, 0, ""); err != nil {
			fmt.Printf("vminit: mount %s on %s: %v\n", m.fstype, m.dir, err)
		}
	}
	os.Setenv("PATH", "/bin")
	os.Setenv("TMPDIR", "/tmp")
	os.Setenv("HOME", "/tmp")
	var uts syscall.Utsname
	syscall.Uname(&uts)
	fmt.Printf("vminit: kernel %s, %d CPU(s)\n", cstr(uts.Release[:]), numCPU())

	args := []string{"-test.v"}
	if b, err := os.ReadFile("/tests/args"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if l = strings.TrimSpace(l); l != "" {
				args = append(args, l)
			}
		}
	}
	tests, _ := filepath.Glob("/tests/*.test")
	sort.Strings(tests)
	if len(tests) == 0 {
		fmt.Println("vminit: no /tests/*.test")
		return 2
	}
	first := 0
	for _, t := range tests {
		start := time.Now()
		cmd := exec.Command(t, args...)
		cmd.Dir = "/tmp"
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stdout
		err := cmd.Run()
		code := 0
		if err != nil {
			code = 1
			if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() > 0 {
				code = ee.ExitCode()
			}
			fmt.Printf("vminit: %s: %v\n", t, err)
		}
		fmt.Printf("VMTEST: %s exit=%d (%.1fs)\n", filepath.Base(t), code, time.Since(start).Seconds())
		if first == 0 {
			first = code
		}
	}
	return first
}

func cstr(b []int8) string {
	var s []byte
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}

func numCPU() int {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "processor") {
			n++
		}
	}
	return n
}

// pack writes the tree at dir as a newc ("070701") cpio archive: for each
// entry a 110-byte ASCII header of thirteen 8-digit hex fields, the name
// with its NUL padded to 4 bytes, the data padded to 4 bytes; then the
// TRAILER!!! entry.
func pack(out, dir string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	ino := 1
	entry := func(name string, mode uint32, data []byte) error {
		hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
			ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(name)+1, 0)
		ino++
		if _, err := w.WriteString(hdr + name + "\x00"); err != nil {
			return err
		}
		w.Write(make([]byte, pad4(len(hdr)+len(name)+1)))
		w.Write(data)
		_, err := w.Write(make([]byte, pad4(len(data))))
		return err
	}
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if rel == "." {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		perm := uint32(info.Mode().Perm())
		switch {
		case d.IsDir():
			return entry(rel, syscall.S_IFDIR|perm, nil)
		case info.Mode().IsRegular():
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			return entry(rel, syscall.S_IFREG|perm, data)
		}
		return fmt.Errorf("%s: only directories and regular files are packed", path)
	})
	if err == nil {
		err = entry("TRAILER!!!", 0, nil)
	}
	if err == nil {
		err = w.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func pad4(n int) int { return (4 - n%4) % 4 }
