"""Drawing stories: the terminal, static HTML, SVG heatmaps, and the interactive page."""
