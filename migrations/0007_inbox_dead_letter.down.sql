DROP TABLE IF EXISTS inbox_dead_letter;
