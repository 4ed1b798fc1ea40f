package dev.dueflow.client;

/** A checked command: its id, its op ({@code cancel}, {@code move}, {@code patch}) and its record. */
public record Command(String id, String op, OutgoingRecord record) {}
