"""Questions asked before a launch: is everything ready (`doctor`), and what will it cost (`estimate`)."""
