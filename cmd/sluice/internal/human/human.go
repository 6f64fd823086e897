// Package human formats figures for people, the same in the CLI's tables and the console's
// pages.
package human

import (
	"fmt"
	"time"
)

// Duration formats d to the second in its two largest units: 45s, 3m20s, 2h5m, 3d4h, 7d.
func Duration(d time.Duration) string {
	d = d.Round(time.Second)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60)
	}
	if h := int(d.Hours()) % 24; h != 0 {
		return fmt.Sprintf("%dd%dh", int(d.Hours())/24, h)
	}
	return fmt.Sprintf("%dd", int(d.Hours())/24)
}
