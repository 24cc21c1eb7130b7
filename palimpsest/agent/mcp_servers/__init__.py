"""MCP servers per profile: their configuration (config), the schemas and results the model sees
(schemas, results), one connection per server (connection), the Agent's set of them (manager), and
their tools (tool). Only connection imports the SDK."""
