"""The paper's figures and the trace figures, drawn from finished run directories."""
