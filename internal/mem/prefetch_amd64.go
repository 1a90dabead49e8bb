package mem

//go:noescape
func prefetch(p *byte, lines int)
