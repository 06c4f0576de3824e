"""nmt-compare: train attention variants side by side (runner), score them (evaluate), report
(summary, markdown, figures)."""
